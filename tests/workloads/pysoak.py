"""A long-running Python service for bench/soak: request handlers doing
a little CPU work, and new code objects all the time, as services make
them at run time (a namedtuple type per request batch, a function compiled
from a template with a new name every 50 ms), so a profiler meets ever more
distinct code objects. Runs argv[1] seconds."""
import collections
import sys
import time


def parse(n):
    return sum(i * i for i in range(n))


def render(n):
    return "".join(str(i) for i in range(n))


def handle(n):
    parse(n)
    render(n // 4)


def main():
    end = time.monotonic() + float(sys.argv[1])
    made = 0
    while time.monotonic() < end:
        for _ in range(20):
            handle(2000)
        made += 1
        collections.namedtuple(f"Row{made}", ["a", "b", "c"])(1, 2, 3)
        ns = {"handle": handle}
        exec(f"def view_{made}(n):\n    return handle(n)\n", ns)
        ns[f"view_{made}"](500)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
