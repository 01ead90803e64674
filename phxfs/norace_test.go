//go:build !race

package phxfs

const raceDetector = false
