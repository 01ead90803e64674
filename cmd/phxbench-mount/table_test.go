package main

import (
	"strings"
	"testing"
)

// TestMedianEvenCount: an even number of samples gives the mean of the
// middle two, so that two fast first places and two slow second places
// weigh alike on both sides.
func TestMedianEvenCount(t *testing.T) {
	r := &row{Samples: map[string][]float64{"backing": {1, 3, 1, 3}, "mount": {5, 1, 3}}}
	if m := r.median("backing"); m != 2 {
		t.Errorf("median of 1 3 1 3 = %v, want 2", m)
	}
	if m := r.median("mount"); m != 3 {
		t.Errorf("median of 5 1 3 = %v, want 3", m)
	}
	if m := r.median("none"); m != 0 {
		t.Errorf("median of nothing = %v", m)
	}
}

// TestStalenessFigures: the staleness row is the mount's median in ms,
// compared with its target directly; a change never seen shows as more
// than the cap; a row without samples says "not run".
func TestStalenessFigures(t *testing.T) {
	r := &row{Name: "staleness", Unit: "ms", Target: 100, MountOnly: true, Samples: map[string][]float64{"mount": {1.2, 1.4, 1.3}}}
	if got := r.figureText(); got != "1.3ms" || r.ok() != "ok" {
		t.Errorf("figure %q, verdict %q", got, r.ok())
	}
	r.Samples["mount"] = []float64{2000, 2000, 2000}
	if got := r.figureText(); !strings.HasPrefix(got, ">2000") || r.ok() != "MISS" {
		t.Errorf("never seen: figure %q, verdict %q", got, r.ok())
	}
	r.Samples = map[string][]float64{}
	if got := formatRow(r); !strings.Contains(got, "not run") {
		t.Errorf("no samples: %q", got)
	}
}

// TestSummaryCells: a configuration that could not mount, or a row it did
// not run, reads "not run"; others show the figure and the verdict.
func TestSummaryCells(t *testing.T) {
	rows := []*row{{Name: "create", Unit: "s", Target: 3, Samples: map[string][]float64{"backing": {1}, "mount": {2}}}}
	if got := summaryCell(rawFile{Rows: rows}, "create"); got != "2.000x ok(<=3.0)" {
		t.Errorf("cell %q", got)
	}
	if got := summaryCell(rawFile{Rows: rows}, "unlink"); got != "not run" {
		t.Errorf("missing row: %q", got)
	}
	if got := summaryCell(rawFile{NotRun: "no passthrough", Rows: rows}, "create"); got != "not run" {
		t.Errorf("configuration not run: %q", got)
	}
}
