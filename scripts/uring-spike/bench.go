package main

import (
	"flag"
	"fmt"
	"log"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

func benchMain(args []string) {
	fl := flag.NewFlagSet("bench", flag.ExitOnError)
	dirs := fl.String("dirs", "", "name=dir,name=dir,...")
	rounds := fl.Int("rounds", 30, "")
	batch := fl.Int("batch", 200, "")
	fl.Parse(args)
	runtime.LockOSThread()
	type side struct {
		name, dir      string
		create, unlink []time.Duration
	}
	var sides []*side
	for _, kv := range strings.Split(*dirs, ",") {
		n, d, _ := strings.Cut(kv, "=")
		sides = append(sides, &side{name: n, dir: d})
	}
	for r := 0; r < *rounds; r++ {
		for k := range sides {
			s := sides[(r+k)%len(sides)]
			d := filepath.Join(s.dir, fmt.Sprintf("r%d", r))
			if err := syscall.Mkdir(d, 0o755); err != nil {
				log.Fatalf("%s: %v", d, err)
			}
			names := make([]string, *batch)
			for i := range names {
				names[i] = filepath.Join(d, fmt.Sprintf("f%d", i))
			}
			for _, n := range names {
				t := time.Now()
				fd, err := syscall.Open(n, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_EXCL|syscall.O_CLOEXEC, 0o644)
				if err != nil {
					log.Fatal(err)
				}
				syscall.Close(fd)
				s.create = append(s.create, time.Since(t))
			}
			for _, n := range names {
				t := time.Now()
				if err := syscall.Unlink(n); err != nil {
					log.Fatal(err)
				}
				s.unlink = append(s.unlink, time.Since(t))
			}
			if err := syscall.Rmdir(d); err != nil {
				log.Fatal(err)
			}
		}
	}
	stat := func(v []time.Duration) (med, mean float64) {
		w := slices.Clone(v)
		slices.Sort(w)
		var sum time.Duration
		for _, x := range w {
			sum += x
		}
		return float64(w[len(w)/2]) / 1e3, float64(sum) / float64(len(w)) / 1e3
	}
	cm0, ca0 := stat(sides[0].create)
	um0, ua0 := stat(sides[0].unlink)
	fmt.Printf("%-8s %14s %14s %14s %14s   (us; ratio to %s)\n", "side", "unlink med", "unlink mean", "create med", "create mean", sides[0].name)
	for _, s := range sides {
		cm, ca := stat(s.create)
		um, ua := stat(s.unlink)
		fmt.Printf("%-8s %7.1f %5.1fx %7.1f %5.1fx %7.1f %5.1fx %7.1f %5.1fx\n", s.name,
			um, um/um0, ua, ua/ua0, cm, cm/cm0, ca, ca/ca0)
	}
}

// rttMain times one FUSE round trip: getxattr is never cached by the kernel.
func rttMain(args []string) {
	fl := flag.NewFlagSet("rtt", flag.ExitOnError)
	dirs := fl.String("dirs", "", "name=dir,...")
	n := fl.Int("n", 20000, "")
	fl.Parse(args)
	runtime.LockOSThread()
	var names, files []string
	var res [][]time.Duration
	for _, kv := range strings.Split(*dirs, ",") {
		nm, d, _ := strings.Cut(kv, "=")
		f := filepath.Join(d, "rttfile")
		fd, err := syscall.Open(f, syscall.O_CREAT|syscall.O_WRONLY, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		syscall.Close(fd)
		names, files = append(names, nm), append(files, f)
		res = append(res, nil)
	}
	buf := make([]byte, 64)
	for i := 0; i < *n; i++ {
		for k := range files {
			j := (i + k) % len(files)
			t := time.Now()
			syscall.Getxattr(files[j], "user.spike", buf)
			res[j] = append(res[j], time.Since(t))
		}
	}
	for k := range files {
		w := res[k]
		slices.Sort(w)
		var sum time.Duration
		for _, x := range w {
			sum += x
		}
		fmt.Printf("%-8s getxattr median %6.1f us  mean %6.1f us  p90 %6.1f us\n", names[k],
			float64(w[len(w)/2])/1e3, float64(sum)/float64(len(w))/1e3, float64(w[len(w)*9/10])/1e3)
		syscall.Unlink(files[k])
	}
}
