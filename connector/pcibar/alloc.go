package pcibar

import (
	"sort"
	"sync"
)

// allocator hands out PageSize-aligned ranges of one BAR, first fit.
type allocator struct {
	mu   sync.Mutex
	size int64
	used []span // sorted by off, disjoint
}

type span struct{ off, size int64 }

var (
	allocMu    sync.Mutex
	allocators = map[string]*allocator{}
)

// allocatorFor returns the process-wide allocator of the BAR of pci.
func allocatorFor(pci string, size int64) *allocator {
	allocMu.Lock()
	defer allocMu.Unlock()
	a := allocators[pci]
	if a == nil || a.size != size {
		a = &allocator{size: size - size%PageSize}
		allocators[pci] = a
	}
	return a
}

func (a *allocator) alloc(size int64) (int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var prev int64
	for i, s := range a.used {
		if s.off-prev >= size {
			a.used = append(a.used[:i], append([]span{{prev, size}}, a.used[i:]...)...)
			return prev, true
		}
		prev = s.off + s.size
	}
	if a.size-prev >= size {
		a.used = append(a.used, span{prev, size})
		return prev, true
	}
	return 0, false
}

func (a *allocator) free(off, size int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := sort.Search(len(a.used), func(i int) bool { return a.used[i].off >= off })
	if i < len(a.used) && a.used[i] == (span{off, size}) {
		a.used = append(a.used[:i], a.used[i+1:]...)
	}
}

// inUse returns the bytes allocated.
func (a *allocator) inUse() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, s := range a.used {
		n += s.size
	}
	return n
}
