package pciaddr

import "testing"

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:C1:1F.7": "0001:c1:1f.7",
		"0000:C1:00.0":     "0000:c1:00.0",
		"GPU-1234":         "gpu-1234",
	} {
		if got := Normalize(in); got != want {
			t.Errorf("Normalize(%q) = %q, want %q", in, got, want)
		}
	}
}
