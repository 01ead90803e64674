// Package defaults fills a configuration's unset numbers: the zero value
// (or a negative one, where the field documents that) means "the default".
package defaults

// Set gives *v the default d when *v is zero or negative.
func Set[T ~int | ~int32 | ~int64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
