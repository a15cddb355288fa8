"""A CPU split built in, for sonde's Python tests: parent() calls heavy()
and light(), which spin for 20 ms and 10 ms of wall time (2:1), forever or
for argv[1] seconds. Pure Python, no sleeps."""
import sys
import time


def spin(secs):
    end = time.perf_counter() + secs
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def heavy():
    return spin(0.020)


def light():
    return spin(0.010)


def parent(until):
    while time.monotonic() < until:
        heavy()
        light()


if __name__ == "__main__":
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 1e9
    parent(time.monotonic() + secs)
