// clients: N concurrent HTTP clients, each on its own kept-alive
// connection, GETting URL back to back for a duration; prints one JSON
// object: requests, requests/s, latency p50/p99 (ms), status codes, errors.
//
//	go run bench/serve/clients.go URL CLIENTS SECONDS
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: clients URL CLIENTS SECONDS")
		os.Exit(2)
	}
	url := os.Args[1]
	n, _ := strconv.Atoi(os.Args[2])
	secs, _ := strconv.Atoi(os.Args[3])
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var mu sync.Mutex
	var lat []float64
	codes := map[string]int{}
	errs := 0
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			var mine []float64
			mycodes := map[string]int{}
			myerrs := 0
			for time.Now().Before(end) {
				t0 := time.Now()
				r, err := c.Get(url)
				if err != nil {
					if myerrs == 0 && os.Getenv("CLIENTS_SHOW_ERRORS") != "" {
						fmt.Fprintln(os.Stderr, err)
					}
					myerrs++
					time.Sleep(10 * time.Millisecond)
					continue
				}
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				mine = append(mine, float64(time.Since(t0).Microseconds())/1000)
				mycodes[strconv.Itoa(r.StatusCode)]++
			}
			mu.Lock()
			lat = append(lat, mine...)
			for k, v := range mycodes {
				codes[k] += v
			}
			errs += myerrs
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Float64s(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(p*float64(len(lat)-1))]
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"requests": len(lat), "per_second": float64(len(lat)) / float64(secs),
		"p50_ms": q(0.50), "p99_ms": q(0.99), "codes": codes, "errors": errs,
	})
}
