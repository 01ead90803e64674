// Command vmnfs is the module-test VM's helper for the NFS-backed phxmount
// step (module/test/steps/80-nfs.sh):
//
//	vmnfs mount SOURCE DIR OPTIONS     mount(2) an NFSv4 export (busybox
//	                                   mount speaks only NFSv2/3)
//	vmnfs info PATH                    print user.phx.info (no getfattr)
//	vmnfs stale SERVERDIR MOUNTDIR MS  the staleness rule for network
//	                                   backing: changes made on the NFS
//	                                   server side show through the
//	                                   phxmount mount within MS
//
// SERVERDIR is the exported directory on the server (the changes are made
// there, not through NFS); MOUNTDIR the same directory through phxmount
// over the NFS mount. Each change is made after the mount has the old
// state cached (stat, read twice, listed), and the time until stat, read
// and readdir through the mount all show it is measured and printed as
// "check ok: ..."; a change not seen within MS fails.
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// commands: each takes exactly its arguments (after the command's name).
var commands = map[string]struct {
	args int
	run  func(a []string) error
}{
	"mount": {3, func(a []string) error {
		if err := unix.Mount(a[0], a[1], "nfs4", 0, a[2]); err != nil {
			return err
		}
		fmt.Printf("check ok: mounted %s on %s (nfs4, %s)\n", a[0], a[1], a[2])
		return nil
	}},
	"info": {1, func(a []string) error { return printInfo(a[0]) }},
	"stale": {3, func(a []string) error {
		ms, err := strconv.Atoi(a[2])
		if err != nil {
			return fmt.Errorf("bound %q: want milliseconds", a[2])
		}
		return stale(a[0], a[1], time.Duration(ms)*time.Millisecond)
	}},
}

const usageText = "usage: vmnfs mount SOURCE DIR OPTIONS | info PATH | stale SERVERDIR MOUNTDIR MS"

func main() {
	var name string
	if len(os.Args) > 1 {
		name = os.Args[1]
	}
	cmd, ok := commands[name]
	if !ok || len(os.Args)-2 != cmd.args {
		exit(2, usageText)
	}
	if err := cmd.run(os.Args[2:]); err != nil {
		exit(1, fmt.Sprintf("vmnfs %s: FAIL: %v", name, err))
	}
}

// exit prints msg on stderr and ends with code.
func exit(code int, msg string) {
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(code)
}

// printInfo prints user.phx.info of path (the VM has no getfattr).
func printInfo(path string) error {
	buf := make([]byte, 16384)
	n, err := unix.Getxattr(path, "user.phx.info", buf)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(buf[:n])
	return err
}

// state is what a name looks like from one side.
type state struct {
	exists bool
	size   int64
	mode   uint32
	data   []byte
	listed bool
}

// stateOf looks at p: stat and its directory's listing, and with data
// its bytes too (an open, at which phxmount revalidates the file: the
// attributes are compared first, without one).
func stateOf(p string, data bool) state {
	var s state
	var st unix.Stat_t
	if unix.Lstat(p, &st) == nil {
		s.exists, s.size, s.mode = true, st.Size, st.Mode
		if data && st.Mode&unix.S_IFMT == unix.S_IFREG {
			s.data, _ = os.ReadFile(p)
		}
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	for _, e := range ents {
		s.listed = s.listed || e.Name() == filepath.Base(p)
	}
	return s
}

func (s state) same(o state) bool {
	return s.exists == o.exists && s.size == o.size && s.mode == o.mode && s.listed == o.listed && bytes.Equal(s.data, o.data)
}

// change is one server-side change of a name.
type change struct {
	what  string
	name  string
	setup func(p string) error
	do    func(p string) error
}

func stale(server, mnt string, bound time.Duration) error {
	write := func(s string) func(string) error {
		return func(p string) error { return os.WriteFile(p, []byte(s), 0644) }
	}
	changes := []change{
		{"a write that changes size and bytes", "stale-data", write("one"), write("two, longer")},
		{"a write that keeps the size", "stale-same", write("aaaa"), write("bbbb")},
		{"a new file", "stale-new", nil, write("new")},
		{"a removed file", "stale-gone", write("gone"), os.Remove},
		{"a chmod", "stale-mode", write("mode"), func(p string) error { return os.Chmod(p, 0600) }},
		{"a rename onto the name", "stale-renamed", write("old"), func(p string) error {
			if err := os.WriteFile(p+".tmp", []byte("renamed in"), 0644); err != nil {
				return err
			}
			return os.Rename(p+".tmp", p)
		}},
	}
	for _, c := range changes {
		sp, mp := filepath.Join(server, c.name), filepath.Join(mnt, c.name)
		if c.setup != nil {
			if err := c.setup(sp); err != nil {
				return err
			}
		}
		// Timestamps move in ticks (4 ms here): a change in the same tick
		// as the state the mount caches, keeping the size, is not told
		// apart by mtime/ctime/size (README, network backing).
		time.Sleep(100 * time.Millisecond)
		stateOf(mp, true)
		stateOf(mp, true)
		stateOf(mp, false) // leaves the attributes cached (a read marks them stale)
		if err := c.do(sp); err != nil {
			return fmt.Errorf("%s on the server side: %w", c.what, err)
		}
		t0 := time.Now()
		want, wantData := stateOf(sp, false), stateOf(sp, true)
		for !stateOf(mp, false).same(want) || !stateOf(mp, true).same(wantData) {
			if time.Since(t0) > bound {
				return fmt.Errorf("%s made on the NFS server side (%s) not seen through the mount within %v", c.what, c.name, bound)
			}
			time.Sleep(10 * time.Millisecond)
		}
		fmt.Printf("check ok: %s made on the NFS server side shows through the mount after %d ms (bound %v)\n",
			c.what, time.Since(t0).Milliseconds(), bound)
	}
	return nil
}
