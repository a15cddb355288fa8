"""Stack shapes for sonde's Python tests, each spinning on the CPU:
`threads` (two threads with 2:1 and 1:3 splits of work), `coro` (an async
chain), `gen` (generators), `sort` (a Python key function called by C's
sorted()), `init` (work in a constructor). A unit of work is a loop calibrated to about 1 ms at start.
Usage: pyshapes.py SHAPE SECONDS."""
import asyncio
import sys
import threading
import time


UNIT = 1000


def spin(ms):
    n = 0
    for _ in range(int(ms * UNIT)):
        n += 1
    return n


def calibrate():
    turns, took = 1000, 0.0
    while took < 0.002:
        turns *= 2
        t0 = time.perf_counter()
        spin(turns / UNIT)
        took = time.perf_counter() - t0
    return max(1, int(turns * 0.001 / took))


def a_heavy():
    spin(20)


def a_light():
    spin(10)


def b_heavy():
    spin(10)


def b_light():
    spin(30)


def thread_a(until):
    while time.monotonic() < until:
        a_heavy()
        a_light()


def thread_b(until):
    while time.monotonic() < until:
        b_heavy()
        b_light()


async def coro_inner():
    spin(5)


async def coro_middle():
    await coro_inner()


async def coro_outer(until):
    while time.monotonic() < until:
        await coro_middle()
        await asyncio.sleep(0)


def gen_inner():
    while True:
        spin(5)
        yield 1


def gen_outer():
    yield from gen_inner()


def gen_consumer(until):
    for _ in gen_outer():
        if time.monotonic() >= until:
            break


def sort_key(x):
    spin(0.5)
    return -x


def sort_caller(until):
    while time.monotonic() < until:
        sorted(range(20), key=sort_key)


class Built:
    """Work done in a constructor: 3.14 calls __init__ through a shim frame."""

    def __init__(self):
        spin(2)


def init_caller(until):
    while time.monotonic() < until:
        Built()


if __name__ == "__main__":
    shape, secs = sys.argv[1], float(sys.argv[2])
    UNIT = calibrate()
    until = time.monotonic() + secs
    if shape == "threads":
        ts = [threading.Thread(target=f, args=(until,)) for f in (thread_a, thread_b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    elif shape == "coro":
        asyncio.run(coro_outer(until))
    elif shape == "gen":
        gen_consumer(until)
    elif shape == "sort":
        sort_caller(until)
    elif shape == "init":
        init_caller(until)
