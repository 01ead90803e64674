module github.com/pawelgaczynski/giouring

go 1.20

require golang.org/x/sys v0.10.0
