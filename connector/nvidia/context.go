package nvidia

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// EnvSync chooses how a thread waiting for the GPU waits: "spin", "yield"
// or "blocking" (the driver's CU_CTX_SCHED_* flags); unset leaves the
// driver's choice (spin when there are fewer contexts than cores). Copy
// waits that spin take cores from the storage reads they overlap with.
const EnvSync = "PHX_CUDA_SYNC"

var schedFlags = map[string]uintptr{"spin": 1, "yield": 2, "blocking": 4}

// ParseSyncMode checks a PHX_CUDA_SYNC value: "" (the driver's choice),
// spin, yield or blocking.
func ParseSyncMode(v string) (string, error) {
	if _, ok := schedFlags[v]; !ok && v != "" {
		return "", errs.New(unix.EINVAL, "nvidia: %s=%q: want spin, yield or blocking (or unset: the driver's choice)", EnvSync, v)
	}
	return v, nil
}

// SyncMode reports how copy waits wait (PHX_CUDA_SYNC), "" for the
// driver's choice.
func (c *Connector) SyncMode() string { return c.sync }

// context returns dev's primary context, retaining it on first use (with
// the PHX_CUDA_SYNC flags set first, where the driver can): retaining
// creates the context (slow, and it takes GPU memory), so listing devices
// does not.
func (c *Connector) context(dev int) (uintptr, error) {
	if ctx := c.ctx[dev].Load(); ctx != 0 {
		return ctx, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errs.New(unix.EBADF, "nvidia: connector closed")
	}
	if ctx := c.ctx[dev].Load(); ctx != 0 {
		return ctx, nil
	}
	if flags, ok := schedFlags[c.sync]; ok && c.d.cuDevicePrimaryCtxSetFlags.addr != 0 {
		if err := c.d.call(c.d.cuDevicePrimaryCtxSetFlags, uintptr(c.cudev[dev]), flags); err != nil {
			return 0, err
		}
	}
	var ctx uintptr
	if err := c.d.call(c.d.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(c.cudev[dev])); err != nil {
		return 0, err
	}
	c.loadKernel(dev, ctx) // before the Store publishes it
	c.ctx[dev].Store(ctx)
	return ctx, nil
}

// inContext runs f with ctx current on a locked thread, restoring the
// thread's previous context after.
func (c *Connector) inContext(ctx uintptr, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	if err := c.d.call(c.d.cuCtxGetCurrent, uintptr(unsafe.Pointer(&prev))); err != nil {
		return err
	}
	defer c.d.call(c.d.cuCtxSetCurrent, prev)
	if err := c.d.call(c.d.cuCtxSetCurrent, ctx); err != nil {
		return err
	}
	return f()
}

// onDev runs f on a locked OS thread with dev's context current, so that
// the driver calls inside f see that context whatever thread runs them.
func (c *Connector) onDev(dev int, f func() error) error {
	ctx, err := c.context(dev)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.call(c.d.cuCtxSetCurrent, ctx); err != nil {
		return err
	}
	return f()
}
