package phxfs

import (
	"os"
	"testing"

	"github.com/phxmount/phxmount/connector"
	"github.com/phxmount/phxmount/connector/nvidia"
	"github.com/phxmount/phxmount/connector/pcibar"
)

// PHX_TEST_CONNECTOR runs the suites on real device memory:
//   - pcibar: the kernel-module VM test (the ivshmem BAR through the phxfs
//     module: the kmod transport);
//   - nvidia: the GPU machine (the staged transport).
func init() {
	switch os.Getenv("PHX_TEST_CONNECTOR") {
	case "pcibar":
		testTransports = func() []Transport { return []Transport{Kmod} }
		newConnector = func(t testing.TB, s setup, devices int) connector.Connector {
			c, err := pcibar.New(pcibar.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return atLeast(t, c, devices)
		}
	case "nvidia":
		testTransports = func() []Transport { return []Transport{Staged} }
		newConnector = func(t testing.TB, s setup, devices int) connector.Connector {
			c, err := nvidia.Open()
			if err != nil {
				t.Fatal(err)
			}
			return atLeast(t, c, devices)
		}
	}
}

// atLeast skips a test that needs more devices than the machine has.
func atLeast(t testing.TB, c connector.Connector, devices int) connector.Connector {
	infos, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) < devices {
		t.Skipf("needs %d %s devices, this machine has %d", devices, c.Vendor(), len(infos))
	}
	return c
}
