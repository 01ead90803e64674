// Package pciaddr writes PCI addresses one way: sysfs's "0000:3b:00.0".
// The CUDA driver prints "00000000:3B:00.0"; matching a client's GPU to the
// mount's device compares the normal forms.
package pciaddr

import (
	"fmt"
	"strings"
)

// Normalize writes a PCI address in sysfs's form from that or the CUDA
// driver's; text that is no PCI address is only lower-cased.
func Normalize(s string) string {
	var dom, bus, dev, fn uint32
	if n, err := fmt.Sscanf(s, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil || n != 4 {
		return strings.ToLower(s)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
}
