package main

import (
	"strings"

	"github.com/phxmount/phxmount/fusefs"
)

const doctorUsage = "usage: phxmount doctor [--vendor V] [--passthrough MODE] [--engine E] [-o cache=MODE] [--json] [BACKING]"

// doctorOpts is what doctor is asked: the path a mount would take (the
// mount's own options, parsed by the same table) and how to report.
type doctorOpts struct {
	c    *config // vendor, engine, fs.Passthrough
	mode fusefs.CacheMode
	dir  string // the directory whose caching doctor reports ("": ".")
	json bool
}

// doctorArgs parses doctor's command line.
func doctorArgs(args []string) (doctorOpts, error) {
	o := doctorOpts{c: &config{vendor: "auto", engine: "auto"}, mode: fusefs.CacheAuto}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, inline, hasInline := strings.Cut(a, "=")
		switch {
		case a == "--json":
			o.json = true
		case a == "-o" && i+1 < len(args):
			i++
			v, ok := strings.CutPrefix(args[i], "cache=")
			m, good := fusefs.ParseCacheMode(v)
			if !ok || !good {
				return o, badf("doctor: -o %s: want cache=auto, cache=exclusive or cache=off", args[i])
			}
			o.mode = m
		case name == "--vendor" || name == "--passthrough" || name == "--engine":
			if !hasInline {
				if i+1 >= len(args) {
					return o, badf("doctor: option %s needs a value", name)
				}
				i++
				inline = args[i]
			}
			f, _ := lookupFlag(name)
			if err := f.set(o.c, inline); err != nil {
				return o, badf("doctor: %v", err)
			}
		case strings.HasPrefix(a, "-"):
			return o, badf("doctor: unknown option %s (%s)", a, doctorUsage)
		case o.dir != "":
			return o, badf("doctor: one BACKING directory at most")
		default:
			o.dir = a
		}
	}
	return o, nil
}
