"""CPU-bound Python DEPTH frames deep, for bench/python: each round
recurses DEPTH frames and spins a fixed amount of work at the bottom; with
`count` it prints "SECOND ROUNDS" (rounds done so far) once a second.
With `many N` instead it spreads the work over N distinct functions (made
at start), for the naming benchmark.
Usage: pydeep.py SECONDS DEPTH [count | many N]"""
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


def main():
    secs, depth = float(sys.argv[1]), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    start = time.monotonic()
    rounds, second = 0, 1
    if mode == "many":
        n = int(sys.argv[4])
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
        down(depth, 2000)
        rounds += 1
        t = time.monotonic() - start
        if mode == "count" and t >= second:
            print(second, rounds, flush=True)
            second += 1
        if t >= secs:
            break


if __name__ == "__main__":
    main()
