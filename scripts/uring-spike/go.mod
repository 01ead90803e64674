module uringspike

go 1.26.0

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/pawelgaczynski/giouring v0.0.0-20230826085535-69588b89acb9
	golang.org/x/sys v0.50.0
)

replace github.com/pawelgaczynski/giouring => ../../third_party/giouring
