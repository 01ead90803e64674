// Package integration mounts phxmount for real (root, /dev/fuse) and drives
// the mount with unmodified tools, comparing every byte and stat with the
// backing directory. Tests skip with a printed reason elsewhere.
package integration
