// cgo both ways, for sonde's Go test: main calls toC(), whose C function
// spins (Go -> C, run on the system stack by asmcgocall), and viaC(), whose
// C function calls back into Go's goBack -> goSpin (C -> Go).
//
//	gocgo SECONDS
package main

/*
#include <stdint.h>
extern uint64_t goBack(uint64_t);
static __attribute__((noinline)) uint64_t c_spin(uint64_t n) {
	uint64_t s = 0;
	for (uint64_t i = 0; i < n; i++) s = s * 6364136223846793005ULL + i;
	return s;
}
static __attribute__((noinline)) uint64_t c_calls_go(uint64_t n) {
	return goBack(n) + 1;
}
*/
import "C"

import (
	"os"
	"strconv"
	"time"
)

var sink uint64

//export goBack
func goBack(n C.uint64_t) C.uint64_t {
	return C.uint64_t(goSpin(uint64(n)))
}

//go:noinline
func goSpin(n uint64) uint64 {
	s := sink
	for i := uint64(0); i < n; i++ {
		s = s*6364136223846793005 + i
	}
	return s
}

//go:noinline
func toC(n uint64) uint64 { return uint64(C.c_spin(C.uint64_t(n))) }

//go:noinline
func viaC(n uint64) uint64 { return uint64(C.c_calls_go(C.uint64_t(n))) }

func main() {
	secs, _ := strconv.ParseFloat(os.Args[1], 64)
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for time.Now().Before(end) {
		sink += toC(4000000)
		sink += viaC(4000000)
	}
}
