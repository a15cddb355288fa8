// A Go workload (frame pointers, no .eh_frame): main.main -> main.outer ->
// main.inner, pure computation.
//
//	gowork [SECONDS=10]
package main

import (
	"os"
	"strconv"
	"time"
)

var sink uint64

//go:noinline
func inner(n int) uint64 {
	s := sink
	for i := 0; i < n; i++ {
		s = s*6364136223846793005 + uint64(i)
	}
	return s
}

//go:noinline
func outer(n int) uint64 {
	r := inner(n)
	sink += r
	return r
}

func main() {
	secs := 10.0
	if len(os.Args) > 1 {
		if v, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			secs = v
		}
	}
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for time.Now().Before(end) {
		sink += outer(200000)
	}
}
