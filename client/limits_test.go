package client

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLimitDoc: docs/abi.md's table of limits is the one limits.go makes.
func TestLimitDoc(t *testing.T) {
	checkGenerated(t, "<!-- limits: generated from client/limits.go; `go test ./client -run TestLimitDoc -update` rewrites it -->\n",
		"<!-- end of limits -->", LimitDoc(), "TestLimitDoc")
}

// TestLimits: every limit has a name, a value, what it bounds and its
// errno (or, for an option, none: past it a request waits); the names are
// unique, and the doc shows each once.
func TestLimits(t *testing.T) {
	seen := map[string]bool{}
	doc := LimitDoc()
	for _, l := range Limits() {
		if l.Name == "" || l.Value == 0 || l.Bounds == "" || (l.Errno == 0 && !l.Option) || seen[l.Name] {
			t.Errorf("limit %+v", l)
		}
		seen[l.Name] = true
		if strings.Count(doc, "| `"+l.Name+"` |") != 1 {
			t.Errorf("the doc shows %s %d times", l.Name, strings.Count(doc, "`"+l.Name+"`"))
		}
	}
	if !strings.Contains(doc, "| `max_pieces` | 65,536 |") || !strings.Contains(doc, "| E2BIG |") {
		t.Errorf("max_pieces or its errno missing from\n%s", doc)
	}
	if got := groupDigits(1234567); got != "1,234,567" {
		t.Errorf("groupDigits = %q", got)
	}
	if ErrnoName(unix.E2BIG) != "E2BIG" {
		t.Errorf("ErrnoName(E2BIG) = %q", ErrnoName(unix.E2BIG))
	}
}

// TestStridedPartsKeepMaxPieces: the Go client sends an extent of more
// than MaxPieces pieces as several, and packs ioctls of at most MaxPieces
// pieces and the largest capacity; each extent's result folds its parts'
// as the daemon folds pieces.
func TestStridedPartsKeepMaxPieces(t *testing.T) {
	ext := []Extent{
		{Buffer: 1, Len: 2, FileOffset: 10, Count: 3*MaxPieces + 5, FileStride: 7, BufStride: 3},
		{Buffer: 2, Len: 4, Count: 100},
		{Buffer: 3, Len: 4, Count: 0}, // one piece
	}
	parts := partsOf(true, ext)
	if len(parts) != 6 {
		t.Fatalf("%d parts, want 4 + 1 + 1", len(parts))
	}
	var pieces uint64
	for k, p := range parts[:4] {
		if p.of != 0 || p.req.FileOffset != 10+uint64(k)*MaxPieces*7 || p.req.BufOffset != uint64(k)*MaxPieces*3 ||
			p.req.FileStride != 7 || p.req.BufStride != 3 {
			t.Errorf("part %d: %+v", k, p)
		}
		pieces += p.req.Count
	}
	if pieces != 3*MaxPieces+5 || parts[3].req.Count != 5 || parts[5].req.Count != 1 {
		t.Errorf("the parts carry %d pieces, the last %d", pieces, parts[3].req.Count)
	}
	var groups []int
	for start := 0; start < len(parts); {
		n := nextGroup(stridedBatch, parts[start:])
		var sum uint64
		for _, p := range parts[start : start+n] {
			sum += p.req.Pieces()
		}
		if sum > MaxPieces || n == 0 {
			t.Fatalf("an ioctl of %d parts, %d pieces", n, sum)
		}
		groups = append(groups, n)
		start += n
	}
	if len(groups) != 4 || groups[3] != 3 {
		t.Errorf("groups %v, want 1, 1, 1, 3", groups)
	}

	// Results: all full; the second part short; the third part failed.
	full := func(p part) int64 { return int64(p.req.Bytes()) }
	res := make([]int64, len(parts))
	for k, p := range parts {
		res[k] = full(p)
	}
	if failed := foldParts(ext, parts, res); failed != 0 || ext[0].Result != 2*(3*MaxPieces+5) || ext[1].Result != 400 {
		t.Errorf("all full: failed %d, results %d %d", failed, ext[0].Result, ext[1].Result)
	}
	res[1] = 9
	if failed := foldParts(ext, parts, res); failed != 1 || ext[0].Result != 2*MaxPieces+9 {
		t.Errorf("second part short: failed %d, result %d", failed, ext[0].Result)
	}
	res[1], res[2] = full(parts[1]), -int64(unix.EIO)
	if foldParts(ext, parts, res); ext[0].Result != 4*MaxPieces {
		t.Errorf("third part failed: result %d, want the bytes before it", ext[0].Result)
	}
	res[0] = -int64(unix.ENOENT)
	if foldParts(ext, parts, res); ext[0].Result != -int64(unix.ENOENT) {
		t.Errorf("first part failed: result %d, want -ENOENT", ext[0].Result)
	}
}
