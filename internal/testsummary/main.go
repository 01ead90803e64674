// Command testsummary makes every test tier's skips visible and lets CI
// refuse the ones that must not happen (see the Makefile and .ci/run):
//
//	go test -json ... 2>&1 | testsummary go -tier unit -out bin/test-skips/unit.jsonl
//	python3 -m unittest -v ... 2>&1 | testsummary python -tier python -out FILE
//	testsummary check [-strict] [-allow FILE] RECORDS...
//
// go and python pass the run through (go: the way `go test` prints it
// without -v, a line per package and the whole output of failing tests; -q:
// nothing but the skips), then print the tier's skipped tests with their
// reasons, write them to -out (one JSON object a line) and exit 1 when the
// run reported a failure.
//
// check prints the skips of all the tiers together, each marked expected
// (with the rule of allowed-skips.txt that expects it) or UNEXPECTED. With
// -strict (CI) it exits 1 when a skip is unexpected or a tier left no
// records.
package main

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

//go:embed allowed-skips.txt
var allowedSkips []byte

const allowedSkipsName = "internal/testsummary/allowed-skips.txt"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: testsummary go|python -tier T [-out FILE] [-q] | testsummary check [-strict] [-allow FILE] RECORDS...")
		return 2
	}
	fs := flag.NewFlagSet("testsummary "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	switch args[0] {
	case "go", "python":
		return runSummarize(fs, args, stdin, stdout, stderr)
	case "check":
		return runCheck(fs, args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "testsummary: unknown command %q\n", args[0])
	return 2
}

// runSummarize is `testsummary go|python`.
func runSummarize(fs *flag.FlagSet, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	tier := fs.String("tier", "", "the tier's name (unit, integration, python, module)")
	out := fs.String("out", "", "file to write the skip records to")
	quiet := fs.Bool("q", false, "print only the skips, not the run")
	if fs.Parse(args[1:]) != nil || *tier == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "testsummary: want -tier and no arguments")
		return 2
	}
	w := stdout
	if *quiet {
		w = io.Discard
	}
	parse := summarizeGo
	if args[0] == "python" {
		parse = summarizePython
	}
	skips, failed, err := parse(stdin, w, *tier)
	if err != nil {
		fmt.Fprintf(stderr, "testsummary: reading the %s run: %v\n", *tier, err)
		return 1
	}
	printTier(stdout, *tier, skips)
	if *out != "" {
		if err := writeRecords(*out, skips); err != nil {
			fmt.Fprintf(stderr, "testsummary: %v\n", err)
			return 1
		}
	}
	if failed {
		fmt.Fprintf(stdout, "%s: FAIL\n", *tier)
		return 1
	}
	return 0
}

// runCheck is `testsummary check`.
func runCheck(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) int {
	strict := fs.Bool("strict", false, "exit 1 when a skip is unexpected or a records file is missing")
	allow := fs.String("allow", "", "the allow-list (default: "+allowedSkipsName+", as built in)")
	if fs.Parse(args[1:]) != nil {
		return 2
	}
	name, data := allowedSkipsName, allowedSkips
	if *allow != "" {
		b, err := os.ReadFile(*allow)
		if err != nil {
			fmt.Fprintf(stderr, "testsummary: %v\n", err)
			return 1
		}
		name, data = *allow, b
	}
	rules, err := parseRules(name, data)
	if err != nil {
		fmt.Fprintf(stderr, "testsummary: %v\n", err)
		return 1
	}
	var skips []Skip
	var missing []string
	for _, f := range fs.Args() {
		s, err := readRecords(f)
		if errors.Is(err, os.ErrNotExist) {
			missing = append(missing, f)
			continue
		}
		if err != nil {
			fmt.Fprintf(stderr, "testsummary: %v\n", err)
			return 1
		}
		skips = append(skips, s...)
	}
	bad := report(stdout, name, rules, skips, missing, *strict)
	if *strict && bad {
		return 1
	}
	return 0
}

// writeRecords writes skips to path, one JSON object a line (an empty file
// when there are none: the tier ran and skipped nothing).
func writeRecords(path string, skips []Skip) error {
	if err := os.MkdirAll(filepath.Dir(path), 0755); err != nil {
		return err
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, s := range skips {
		if err := enc.Encode(s); err != nil {
			return err
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0644)
}

func readRecords(path string) ([]Skip, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var skips []Skip
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var s Skip
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n, err)
		}
		skips = append(skips, s)
	}
	return skips, sc.Err()
}
