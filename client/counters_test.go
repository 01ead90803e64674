package client

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/abi.md's generated tables (counters, limits)")

// abiDoc is the ABI's documentation, whose tables are generated here.
const abiDoc = "../docs/abi.md"

// checkGenerated checks that abiDoc holds want between the marker lines
// begin (which names the test that rewrites it) and end; with -update it
// rewrites that part.
func checkGenerated(t *testing.T, begin, end, want, test string) {
	t.Helper()
	b, err := os.ReadFile(abiDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no generated table between %q and %q", abiDoc, begin, end)
	}
	want = begin + want
	if got := doc[i:j]; got != want {
		if !*update {
			t.Fatalf("%s's table is stale; run: go test ./client -run %s -update", abiDoc, test)
		}
		if err := os.WriteFile(abiDoc, []byte(doc[:i]+want+doc[j:]), 0644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCounterDoc: docs/abi.md's counter table is the one counters.go makes.
func TestCounterDoc(t *testing.T) {
	checkGenerated(t, "<!-- counters: generated from client/counters.go; `go test ./client -run TestCounterDoc -update` rewrites it -->\n",
		"<!-- end of counters -->", CounterDoc(), "TestCounterDoc")
}

// TestCounterNames: names are unique snake_case, and Each walks them in
// wire order with the values of their fields.
func TestCounterNames(t *testing.T) {
	seen := map[string]bool{}
	var c Counters
	for i, p := range c.fields() {
		*p = uint64(i)
	}
	i := 0
	c.Each(func(name string, v uint64) {
		if seen[name] || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz_") != "" {
			t.Errorf("counter name %q", name)
		}
		seen[name] = true
		if v != uint64(i) || CounterNames()[i] != name {
			t.Errorf("counter %d %q = %d", i, name, v)
		}
		i++
	})
	if i != numCounters {
		t.Errorf("Each walked %d of %d counters", i, numCounters)
	}
}

// TestCounterDescs: every gauge names a counter, and the descriptions
// follow the table.
func TestCounterDescs(t *testing.T) {
	names := map[string]bool{}
	for i, d := range CounterDescs() {
		names[d.Name] = true
		if d.Name != CounterNames()[i] || d.Doc == "" || d.Gauge != gauges[d.Name] {
			t.Errorf("counter %d: %+v", i, d)
		}
	}
	var c Counters
	if !c.Set("ioctl_calls", 7) || c.IoctlCalls != 7 || c.Set("no_such_counter", 1) {
		t.Errorf("Set: %+v", c)
	}
	for g := range gauges {
		if !names[g] {
			t.Errorf("gauge %q is not a counter of the table", g)
		}
	}
}
