package nvidia

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// CUresult codes given an errno of their own (cuda.h).
const (
	cudaErrorInvalidValue      = 1
	cudaErrorOutOfMemory       = 2
	cudaErrorStubLibrary       = 34
	cudaErrorDeviceUnavailable = 46
	cudaErrorNoDevice          = 100
	cudaErrorInvalidDevice     = 101
	cudaErrorInvalidHandle     = 400
	cudaErrorNotSupported      = 801
)

// CUDAError is a failed driver call. It unwraps to an errno so callers
// match it with errors.Is(err, unix.ENOMEM) like every other layer's error.
type CUDAError struct {
	Func  string // the driver entry point, e.g. "cuMemAlloc_v2"
	Code  uint32 // the CUresult
	Name  string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Desc  string // e.g. "out of memory"
	Errno unix.Errno
}

func (e *CUDAError) Error() string {
	if e.Desc == "" {
		return fmt.Sprintf("%s: %s", e.Func, e.Name)
	}
	return fmt.Sprintf("%s: %s (%s)", e.Func, e.Name, e.Desc)
}

// Unwrap exposes the errno.
func (e *CUDAError) Unwrap() error { return e.Errno }

// newCUDAError builds the error; name falls back to the number when the
// driver cannot name the code.
func newCUDAError(fname string, code uint32, name, desc string) *CUDAError {
	if name == "" {
		name = fmt.Sprintf("CUDA_ERROR_%d", code)
	}
	return &CUDAError{Func: fname, Code: code, Name: name, Desc: desc, Errno: errnoFor(code)}
}

// errnoFor maps a CUresult to the errno the rest of the project reports.
func errnoFor(code uint32) unix.Errno {
	switch code {
	case cudaErrorInvalidValue, cudaErrorInvalidHandle:
		return unix.EINVAL
	case cudaErrorOutOfMemory:
		return unix.ENOMEM
	case cudaErrorNoDevice, cudaErrorInvalidDevice, cudaErrorStubLibrary:
		return unix.ENODEV
	case cudaErrorDeviceUnavailable:
		return unix.EBUSY
	case cudaErrorNotSupported:
		return unix.EOPNOTSUPP
	}
	return unix.EIO
}
