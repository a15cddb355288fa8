"""A CPU split built in, for sonde's Python tests: parent() calls heavy()
and light(), which run the same loop for 2n and n turns (n calibrated to
about 10 ms at start), so 2:1 of the CPU however fast the machine and
however often the process is preempted. Pure Python, no sleeps; runs
forever or for argv[1] seconds."""
import sys
import time


def spin(turns):
    n = 0
    for _ in range(turns):
        n += 1
    return n


def heavy(turns):
    return spin(2 * turns)


def light(turns):
    return spin(turns)


def parent(until, turns):
    while time.monotonic() < until:
        heavy(turns)
        light(turns)


def calibrate():
    turns, took = 1000, 0.0
    while took < 0.002:
        turns *= 2
        t0 = time.perf_counter()
        spin(turns)
        took = time.perf_counter() - t0
    return max(1, int(turns * 0.010 / took))


if __name__ == "__main__":
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 1e9
    parent(time.monotonic() + secs, calibrate())
