package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/phxmount/phxmount/phxfs"
)

// The report: each measurement is printed as a row as it is made and kept
// for the JSON file (-out) that python/tools/gpu_report.py turns into the
// ratio table. The row names and the JSON's fields are what it reads.

// result is one row. A row that could not be measured honestly has no
// seconds and no rate, and says why in error.
type result struct {
	Name    string  `json:"name"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds,omitempty"`
	GBps    float64 `json:"gbps,omitempty"`
	Note    string  `json:"note,omitempty"`
	Error   string  `json:"error,omitempty"`
}

type report struct {
	File      string            `json:"file"`
	FileBytes int64             `json:"file_bytes"`
	DataBytes int64             `json:"data_bytes"`
	Threads   int               `json:"threads"`
	Results   []result          `json:"results"`
	Sweep     []result          `json:"sweep"`
	Chosen    map[string]int64  `json:"chosen"`
	Staged    map[string]any    `json:"staged_counters"`
	Device    string            `json:"device"`
	Notes     []string          `json:"notes"`
	Env       map[string]string `json:"env"`
}

// newReport starts the report of file, whose data section is dataLen bytes.
func newReport(file string, dataLen int64, threads int) (*report, error) {
	st, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	return &report{File: file, FileBytes: st.Size(), DataBytes: dataLen, Threads: threads, Chosen: map[string]int64{},
		Env: map[string]string{"GOMAXPROCS": strconv.Itoa(runtime.GOMAXPROCS(0)), "direct_io": os.Getenv(phxfs.EnvODirect)}}, nil
}

// newResult is the measurement of bytes moved in d.
func newResult(name string, bytes int64, d time.Duration, note string) result {
	return result{Name: name, Bytes: bytes, Seconds: d.Seconds(), GBps: float64(bytes) / d.Seconds() / 1e9, Note: note}
}

// add records and prints a result.
func (r *report) add(name string, bytes int64, d time.Duration, note string) {
	x := newResult(name, bytes, d, note)
	r.Results = append(r.Results, x)
	fmt.Printf("%-40s %8.2f GB/s  %7.3fs  %s\n", name, x.GBps, x.Seconds, note)
}

// notRun records and prints a row that was not measured, and why.
func (r *report) notRun(name, why string) {
	r.Results = append(r.Results, result{Name: name, Note: "not run: " + why, Error: why})
	fmt.Printf("%-40s not run: %s\n", name, why)
}

// addSweep records and prints one point of the sweep.
func (r *report) addSweep(x result) {
	r.Sweep = append(r.Sweep, x)
	fmt.Printf("sweep %-48s %8.2f GB/s\n", x.Name, x.GBps)
}

// write writes the report as indented JSON (best effort: the rows are
// printed already).
func (r *report) write(path string) {
	b, _ := json.MarshalIndent(r, "", " ")
	os.WriteFile(path, b, 0o644)
}
