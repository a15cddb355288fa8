// A Go workload with a CPU split built in, for sonde's Go test: parent()
// calls heavy() and light(), which run the frameless leaf spin() for 2n and
// n turns (2:1 of the CPU); spin's loop body is step(), inlined into it.
// spin sets up no frame, so a frame-pointer walk skips its caller; Go's own
// table says where each frame is. With a path as second argument it writes
// its own runtime/pprof CPU profile of the run there (the test's oracle).
//
//	gosplit SECONDS [CPU.pprof]
package main

import (
	"math/rand"
	"os"
	"runtime/pprof"
	"strconv"
	"time"
)

var sink uint64

func step(s uint64, i int) uint64 {
	return s*6364136223846793005 + uint64(i)
}

//go:noinline
func spin(n int) uint64 {
	s := sink
	for i := 0; i < n; i++ {
		s = step(s, i)
	}
	return s
}

//go:noinline
func heavy(n int) uint64 {
	return spin(2*n) + 1
}

//go:noinline
func light(n int) uint64 {
	return spin(n) + 1
}

func add(a, b uint64) uint64 {
	return a ^ b
}

// Each round's n is drawn anew (1M to 3M turns; heavy and light share it,
// so their split stays 2:1): with one fixed n a round took a fixed time,
// and under a slow emulator (a qemu guest) that came close to two periods
// of a 99 Hz sampler, which then fell at the same points of every round:
// 196 : 195 in one run, 0.61 to 0.72 in others.
//
//go:noinline
func parent(end time.Time) {
	for time.Now().Before(end) {
		n := 1000000 + rand.Intn(2000000)
		sink = add(sink, heavy(n))
		sink = add(sink, light(n))
	}
}

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	if len(os.Args) > 2 {
		f, err := os.Create(os.Args[2])
		if err != nil {
			panic(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	parent(time.Now().Add(time.Duration(secs * float64(time.Second))))
}
