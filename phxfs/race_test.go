//go:build race

package phxfs

// raceDetector: this test binary runs under the race detector, whose
// sync.Pool drops a share of what is put back, on purpose.
const raceDetector = true
