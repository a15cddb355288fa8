"""sonde why's hottest functions: heavy() and light() each run a loop of
their own, 2n and n turns, so 2:1 of the CPU however fast the machine and
however often the process is preempted, and each is the innermost Python
frame while it runs. Pure Python, no sleeps; runs for argv[1] seconds."""
import sys
import time


def heavy(turns):
    n = 0
    for _ in range(2 * turns):
        n += 1
    return n


def light(turns):
    n = 0
    for _ in range(turns):
        n += 1
    return n


def main():
    until = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < until:
        heavy(20000)
        light(20000)


main()
