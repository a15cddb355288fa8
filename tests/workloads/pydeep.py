"""CPU-bound Python DEPTH frames deep, for bench/python: each round
recurses DEPTH frames and spins a fixed amount of work at the bottom; with
`count` it prints "SECOND ROUNDS CPU_NS" (rounds done so far, and the
thread's CPU time: on a kernel without IRQ_TIME_ACCOUNTING it includes the
profilers' sampling interrupts and excludes the hypervisor's steal) once a
second.
With `distinct` the DEPTH frames are as many distinct functions (made at
start) instead of one recursing; `count` can follow it. With `many N`
instead it spreads the work over N distinct functions (made at start), for
the naming benchmark.
Usage: pydeep.py SECONDS DEPTH [distinct] [count | many N]"""
import sys
import time


def spin(turns):
    n = 0
    for _ in range(turns):
        n += 1
    return n


def down(depth, turns):
    if depth <= 0:
        return spin(turns)
    return down(depth - 1, turns)


def chain(depth):
    """d0 -> d1 -> ... -> dDEPTH -> spin: DEPTH + 1 distinct functions."""
    ns = {"spin": spin}
    src = "".join(f"def d{i}(depth, turns):\n    return d{i + 1}(depth, turns)\n" for i in range(depth))
    exec(src + f"def d{depth}(depth, turns):\n    return spin(turns)\n", ns)
    return ns["d0"]


def main():
    secs, depth = float(sys.argv[1]), int(sys.argv[2])
    args = sys.argv[3:]
    top = down
    if args[:1] == ["distinct"]:
        top = chain(depth)
        args = args[1:]
    mode = args[0] if args else ""
    start = time.monotonic()
    rounds, second = 0, 1
    if mode == "many":
        n = int(args[1])
        funcs = []
        for i in range(n):
            ns = {"spin": spin}
            exec(f"def work_{i}():\n    return spin(200)\n", ns)
            funcs.append(ns[f"work_{i}"])
        while time.monotonic() - start < secs:
            for f in funcs:
                f()
        return
    while True:
        top(depth, 2000)
        rounds += 1
        t = time.monotonic() - start
        if mode == "count" and t >= second:
            print(second, rounds, time.thread_time_ns(), flush=True)
            second += 1
        if t >= secs:
            break


if __name__ == "__main__":
    main()
