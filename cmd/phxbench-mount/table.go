package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// One configuration's table, its raw numbers, and the summary of several
// configurations' raw numbers (one column each).

func printTable(rows []*row, vm bool) {
	label := ""
	if *config != "" {
		label = " [" + *config + "]"
	}
	fmt.Printf("%-38s %12s %12s %8s %8s %s\n", "benchmark (median of "+strconv.Itoa(*reps)+")"+label, "backing", "mount", "ratio", "target", "")
	for _, r := range rows {
		fmt.Println(formatRow(r))
	}
	fmt.Println("ratio: mount/backing; for rates higher is better, for times (s) lower is better; staleness: ms, mount only")
	fmt.Println(hostCacheNote(vm))
}

// verdict is what a row shows instead of its figure, if anything: a cold
// row whose samples were not all cold on both sides says why.
func (r *row) verdict() string {
	if r.Cold {
		if cold, why := r.coldVerdict(); !cold {
			return why
		}
	}
	if len(r.Samples["mount"]) == 0 {
		return "not run"
	}
	return ""
}

func (r *row) targetText() string {
	switch {
	case r.Target == 0:
		return ""
	case r.MountOnly:
		return fmt.Sprintf("<=%g", r.Target)
	case r.Higher:
		return fmt.Sprintf(">=%.2f", r.Target)
	}
	return fmt.Sprintf("<=%.1f", r.Target)
}

// figureText is the row's figure: a ratio, or milliseconds (with ">" when
// a sample never saw the change).
func (r *row) figureText() string {
	if why := r.verdict(); why != "" {
		return why
	}
	if r.MountOnly {
		m := r.median("mount")
		if m >= float64(staleCap.Milliseconds()) {
			return fmt.Sprintf(">%.0fms", m)
		}
		return fmt.Sprintf("%.1fms", m)
	}
	return fmt.Sprintf("%.3fx", r.ratio())
}

// formatRow is one line of the table.
func formatRow(r *row) string {
	b, m := fmtv(r.median("backing"), r.Unit), fmtv(r.median("mount"), r.Unit)
	if r.MountOnly {
		b = "-"
	}
	if why := r.verdict(); why != "" {
		return fmt.Sprintf("%-38s %12s %12s  %s", r.Name, b, m, why)
	}
	return fmt.Sprintf("%-38s %12s %12s %8s %8s %s", r.Name, b, m, r.figureText(), r.targetText(), r.ok())
}

// rawFile is what -raw writes and -summary reads.
type rawFile struct {
	Time        string `json:"time"`
	Config      string `json:"config"`
	Passthrough string `json:"passthrough"`
	Cache       string `json:"cache"`
	Note        string `json:"note"`
	NotRun      string `json:"not_run,omitempty"` // written by scripts/bench-mount.sh for a configuration that could not mount
	Rows        []*row `json:"rows"`
}

func writeRaw(rows []*row) {
	if *rawOut == "" {
		return
	}
	b, _ := json.MarshalIndent(rawFile{Time: time.Now().Format(time.RFC3339), Config: *config, Passthrough: *passthrough,
		Cache: *cacheMode, Note: *note, Rows: rows}, "", "  ")
	if err := os.WriteFile(*rawOut, b, 0644); err != nil {
		die("%v", err)
	}
	fmt.Printf("raw numbers: %s\n", *rawOut)
}

func fmtv(v float64, unit string) string {
	switch unit {
	case "s":
		return fmt.Sprintf("%.3f s", v)
	case "ms":
		return fmt.Sprintf("%.1f ms", v)
	case "ops/s":
		return fmt.Sprintf("%.0f/s", v)
	}
	return fmt.Sprintf("%.0f MB/s", v)
}

// printSummary prints one table of the raw files' figures: a row per
// benchmark, a column per configuration, each figure with its verdict
// against that configuration's target ("not run" where the configuration
// or the row was not run).
func printSummary(files []string) {
	var raws []rawFile
	for _, p := range files {
		var rf rawFile
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &rf)
		}
		if err != nil {
			die("%s: %v", p, err)
		}
		raws = append(raws, rf)
	}
	var names []string
	for _, rf := range raws {
		for _, r := range rf.Rows {
			if !slices.Contains(names, r.Name) {
				names = append(names, r.Name)
			}
		}
	}
	fmt.Printf("%-38s", "mount/backing (ms: staleness)")
	for _, rf := range raws {
		fmt.Printf(" %22s", rf.Config)
	}
	fmt.Println()
	for _, name := range names {
		fmt.Printf("%-38s", name)
		for _, rf := range raws {
			fmt.Printf(" %22s", summaryCell(rf, name))
		}
		fmt.Println()
	}
	for _, rf := range raws {
		if rf.NotRun != "" {
			fmt.Printf("%s: not run: %s\n", rf.Config, rf.NotRun)
		}
	}
}

// summaryCell is one configuration's figure for a row, with its verdict.
func summaryCell(rf rawFile, name string) string {
	if rf.NotRun != "" {
		return "not run"
	}
	for _, r := range rf.Rows {
		if r.Name != name {
			continue
		}
		cell := r.figureText()
		if strings.HasPrefix(cell, "not cold") {
			return "not cold"
		}
		if ok := r.ok(); ok != "" && r.verdict() == "" {
			cell += " " + ok + "(" + r.targetText() + ")"
		}
		return cell
	}
	return "not run"
}
