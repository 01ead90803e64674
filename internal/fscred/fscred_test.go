package fscred

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// onRootThread runs f on a locked thread as root (the tests' daemon), or
// skips saying why.
func onRootThread(t *testing.T, f func(base State)) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	base, e := Current()
	if e != 0 {
		t.Fatal(e)
	}
	if base.FSUID != 0 || base.FSGID != 0 {
		t.Skipf("skipped: needs fsuid and fsgid 0 (root), have %d and %d", base.FSUID, base.FSGID)
	}
	f(base)
	if now, _ := Current(); !now.Equal(base) {
		t.Fatalf("the thread did not get its credentials back: %+v, want %+v", now, base)
	}
}

const dacOverride = 1 << unix.CAP_DAC_OVERRIDE

// TestTakeAndGiveBack: each way of taking credentials holds them while
// its function runs and gives the thread exactly its own back.
func TestTakeAndGiveBack(t *testing.T) {
	onRootThread(t, func(base State) {
		var in State
		c := Creds{FSUID: 1000, FSGID: 1001, Groups: []int{7}, CapEff: [2]uint32{dacOverride, 0}}
		if e := As(c, func() { in, _ = Current() }); e != 0 {
			t.Fatal(e)
		}
		if in.FSUID != 1000 || in.FSGID != 1001 || len(in.Groups) != 1 || in.Groups[0] != 7 || in.Caps[0].Effective != dacOverride&base.Caps[0].Permitted {
			t.Errorf("As: %+v", in)
		}

		took, back := WithIDs(base, 1002, 1003, func() { in, _ = Current() })
		if !took || !back || in.FSUID != 1002 || in.FSGID != 1003 {
			t.Errorf("WithIDs: took %v back %v, %+v", took, back, in)
		}
		if base.Caps[0].Effective&dacOverride != 0 && in.Caps[0].Effective&dacOverride != 0 {
			t.Errorf("WithIDs: the file-system capabilities stayed with fsuid %d", in.FSUID)
		}

		w := Writer(base)
		TakeIDs(base, w.FSUID, w.FSGID, true)
		in, _ = Current()
		took, back = GiveIDsBack(base, w.FSUID, w.FSGID)
		if !took || !back || in.FSUID != int(w.FSUID) || in.FSGID != int(w.FSGID) || in.Caps != base.Caps {
			t.Errorf("TakeIDs with the capabilities: took %v back %v, %+v, want the ids of %+v and caps %+v", took, back, in, w, base.Caps)
		}
	})
}

// TestWriter: the writer is the overflow ids, no group, the base's
// effective capabilities.
func TestWriter(t *testing.T) {
	base := State{Caps: [2]unix.CapUserData{{Effective: 5, Permitted: 7}, {Effective: 1}}}
	w := Writer(base)
	if w.FSUID == 0 || w.FSGID == 0 || len(w.Groups) != 0 || w.Groups == nil || w.CapEff != [2]uint32{5, 1} {
		t.Errorf("Writer: %+v", w)
	}
}
