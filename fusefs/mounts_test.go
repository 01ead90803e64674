package fusefs

import (
	"slices"
	"testing"

	"github.com/phxmount/phxmount/internal/procfs"
)

// TestMountsBelow: only mount points strictly below the backing root
// count (not the root itself, not a sibling sharing its prefix); a mount
// point whose mounts changed (one added, one gone, one replaced by a new
// mount of the same device) is listed, and the replaced and gone mounts'
// devices are the policies to forget.
func TestMountsBelow(t *testing.T) {
	mt := func(id int, dev uint64, at string) procfs.Mount {
		return procfs.Mount{ID: id, Dev: dev, MountPoint: at}
	}
	before := mountsBelow([]procfs.Mount{
		mt(1, 1, "/"), mt(2, 2, "/data"), mt(3, 3, "/data/a"), mt(4, 4, "/data2/x"), mt(5, 5, "/data/b c/d"), mt(6, 6, "/data/same"),
	}, "/data")
	if len(before) != 3 || len(before["a"]) != 1 || len(before["b c/d"]) != 1 || len(before["same"]) != 1 {
		t.Fatalf("mountsBelow: %v", before)
	}
	after := mountsBelow([]procfs.Mount{
		mt(1, 1, "/"), mt(2, 2, "/data"), mt(7, 3, "/data/a"), mt(6, 6, "/data/same"), mt(8, 8, "/data/new"),
	}, "/data/")
	got := changedMountPoints(before, after)
	if want := []string{"a", "b c/d", "new"}; !slices.Equal(got, want) {
		t.Errorf("changed mount points %q, want %q", got, want)
	}
	if g := gone(before["a"], after["a"]); !slices.Equal(g, []uint64{3}) {
		t.Errorf("a remounted on the same device: gone %v", g)
	}
	if g := gone(before["same"], after["same"]); len(g) != 0 {
		t.Errorf("an unchanged mount: gone %v", g)
	}
}
