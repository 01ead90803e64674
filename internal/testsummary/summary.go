package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Skip is one skipped test.
type Skip struct {
	Tier    string `json:"tier"`
	Package string `json:"package"` // Go: the import path; Python: module.Class
	Test    string `json:"test"`
	Reason  string `json:"reason"`
}

func (s Skip) name() string {
	if s.Package == "" {
		return s.Test
	}
	return s.Package + "." + s.Test
}

// event is a line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

var (
	goHeader = regexp.MustCompile(`^\s*(=== (RUN|PAUSE|CONT|NAME)\s|--- SKIP: )`)
	goPos    = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)
)

// skipReason is what a skipped test printed, less the framing lines and the
// file:line prefixes, its lines joined by " / ".
func skipReason(lines []string) string {
	var parts []string
	for _, l := range lines {
		if goHeader.MatchString(l) {
			continue
		}
		if l = goPos.ReplaceAllString(strings.TrimSpace(l), ""); l != "" {
			parts = append(parts, l)
		}
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " / ")
}

// summarizeGo reads `go test -json` (or `go tool test2json`) output from r,
// writes what `go test` without -v would print to w and returns the
// skipped tests and whether anything failed. Lines that are not test2json
// events (go's own errors on stderr) pass through unchanged.
func summarizeGo(r io.Reader, w io.Writer, tier string) ([]Skip, bool, error) {
	type key struct{ pkg, test string }
	out := map[key][]string{}
	var skips []Skip
	failed := false
	print := func(lines []string) {
		for _, l := range lines {
			io.WriteString(w, l)
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			out[k] = append(out[k], e.Output)
		case "build-output":
			io.WriteString(w, e.Output)
		case "build-fail":
			failed = true
		case "pass", "skip":
			if e.Test != "" && e.Action == "skip" {
				skips = append(skips, Skip{Tier: tier, Package: e.Package, Test: e.Test, Reason: skipReason(out[k])})
			}
			if e.Test == "" { // the package: its "ok" or "?" line
				for _, l := range out[k] {
					if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "?") {
						io.WriteString(w, l)
					}
				}
			}
			delete(out, k)
		case "fail":
			failed = true
			if e.Test != "" {
				print(out[k])
				delete(out, k)
				break
			}
			// The package failed (a timeout, a panic, a failing TestMain):
			// what its unfinished tests printed, then its own output.
			var open []key
			for kk := range out {
				if kk.pkg == e.Package && kk.test != "" {
					open = append(open, kk)
				}
			}
			sort.Slice(open, func(i, j int) bool { return open[i].test < open[j].test })
			for _, kk := range open {
				print(out[kk])
				delete(out, kk)
			}
			print(out[k])
			delete(out, k)
		}
	}
	return skips, failed, sc.Err()
}

var (
	pyTest    = regexp.MustCompile(`^(\w+) \(([\w.]+)\)`)
	pySkipped = regexp.MustCompile(`\.\.\. skipped ('.*'|".*")$`)
	pyResult  = regexp.MustCompile(`^(OK|FAILED)(?: \((.*)\))?$`)
	pyCount   = regexp.MustCompile(`\bskipped=(\d+)`)
)

// summarizePython reads `python3 -m unittest -v` output from r, copies it
// to w and returns the skipped tests ("name (module.Class[.name]) ...
// skipped 'reason'", where a docstring may put the verdict on the next
// line) and whether the run failed. When unittest counts more skips than
// were parsed, the difference is a skip with no name: unexpected on CI.
func summarizePython(r io.Reader, w io.Writer, tier string) ([]Skip, bool, error) {
	var skips []Skip
	var cur Skip
	failed, reported, sawResult := false, 0, false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(w, line)
		if m := pyTest.FindStringSubmatch(line); m != nil {
			cur = Skip{Tier: tier, Package: strings.TrimSuffix(m[2], "."+m[1]), Test: m[1]}
		}
		if m := pySkipped.FindStringSubmatch(line); m != nil {
			s := cur
			s.Reason = m[1][1 : len(m[1])-1]
			if s.Test == "" {
				s.Test = "(unnamed)"
			}
			skips = append(skips, s)
			cur = Skip{}
		}
		if m := pyResult.FindStringSubmatch(line); m != nil {
			sawResult = true
			failed = failed || m[1] == "FAILED"
			reported = 0
			if c := pyCount.FindStringSubmatch(m[2]); c != nil {
				reported, _ = strconv.Atoi(c[1])
			}
		}
	}
	if !sawResult {
		failed = true
		fmt.Fprintf(w, "%s: no unittest result line (OK or FAILED) in the output\n", tier)
	}
	if reported > len(skips) {
		skips = append(skips, Skip{Tier: tier, Test: "(unparsed)", Reason: fmt.Sprintf("unittest reported %d skipped, %d found in its output", reported, len(skips))})
	}
	return skips, failed, sc.Err()
}

// printTier prints a tier's skips after its run.
func printTier(w io.Writer, tier string, skips []Skip) {
	if len(skips) == 0 {
		fmt.Fprintf(w, "%s: no test skipped\n", tier)
		return
	}
	fmt.Fprintf(w, "%s: %d skipped:\n", tier, len(skips))
	for _, s := range skips {
		fmt.Fprintf(w, "  SKIP %s: %s\n", s.name(), s.Reason)
	}
}

// rule is a line of allowed-skips.txt.
type rule struct {
	where        string // file:line
	tier         string // or "*"
	test, reason *regexp.Regexp
}

// parseRules parses an allow-list: "TIER TEST REASON" a line, TEST a regexp
// for the whole test name, REASON (the rest of the line) one searched for
// in the reason; # comments and blank lines are ignored.
func parseRules(name string, data []byte) ([]rule, error) {
	var rules []rule
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, i+1)
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s: want TIER TEST REASON", where)
		}
		rest := strings.TrimSpace(line[len(f[0]):])
		reason := strings.TrimSpace(rest[len(f[1]):])
		switch f[0] {
		case "unit", "integration", "python", "module", "*":
		default:
			return nil, fmt.Errorf("%s: unknown tier %q", where, f[0])
		}
		t, err := regexp.Compile(`^(?:` + f[1] + `)$`)
		if err != nil {
			return nil, fmt.Errorf("%s: TEST: %v", where, err)
		}
		re, err := regexp.Compile(reason)
		if err != nil {
			return nil, fmt.Errorf("%s: REASON: %v", where, err)
		}
		rules = append(rules, rule{where: where, tier: f[0], test: t, reason: re})
	}
	return rules, nil
}

// expectedBy returns the first rule that expects s, or nil.
func expectedBy(rules []rule, s Skip) *rule {
	for i, r := range rules {
		if (r.tier == "*" || r.tier == s.Tier) && r.test.MatchString(s.Test) && r.reason.MatchString(s.Reason) {
			return &rules[i]
		}
	}
	return nil
}

// report prints the combined skip summary and returns whether something is
// wrong: an unexpected skip or a missing records file.
func report(w io.Writer, rulesName string, rules []rule, skips []Skip, missing []string, strict bool) bool {
	var unexpected []Skip
	fmt.Fprintf(w, "\n== skip summary (expected skips: %s)\n", rulesName)
	for _, s := range skips {
		if r := expectedBy(rules, s); r != nil {
			fmt.Fprintf(w, "  expected   %-11s %s: %s  [%s]\n", s.Tier, s.name(), s.Reason, r.where)
		} else {
			unexpected = append(unexpected, s)
			fmt.Fprintf(w, "  UNEXPECTED %-11s %s: %s\n", s.Tier, s.name(), s.Reason)
		}
	}
	for _, m := range missing {
		fmt.Fprintf(w, "  MISSING    %s: no skip records (did the tier run?)\n", m)
	}
	fmt.Fprintf(w, "== %d skipped: %d expected, %d unexpected\n", len(skips), len(skips)-len(unexpected), len(unexpected))
	if len(unexpected) == 0 && len(missing) == 0 {
		return false
	}
	verdict := "CI (make test STRICT=1) would fail on these"
	if strict {
		verdict = "FAIL: these must not skip here"
	}
	fmt.Fprintf(w, "== %s (add a rule to %s only for a skip that cannot run on CI, and say why):\n", verdict, rulesName)
	for _, s := range unexpected {
		fmt.Fprintf(w, "  %s %s: %s\n", s.Tier, s.name(), s.Reason)
	}
	for _, m := range missing {
		fmt.Fprintf(w, "  %s: missing\n", m)
	}
	return true
}
