package main

import (
	"bytes"
	"os"
	"testing"
)

// TestGoldenFileIsCurrent: python/tests/golden_abi.json, which the Python
// client's tests check their packing against, is what package client
// encodes today.
func TestGoldenFileIsCurrent(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../golden_abi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("python/tests/golden_abi.json is stale: go run ./python/tests/goldengen > python/tests/golden_abi.json")
	}
}
