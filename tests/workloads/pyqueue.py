"""sonde why's lock releasers: a consumer blocked in the standard library's
queue.Queue.get(), a producer that puts an item every 20 ms. The consumer's
lock (a threading.Condition's waiter lock) is released by the producer in
Condition.notify(), called from Queue.put(), called from producer(): code
of Python's own (queue.py, threading.py) between the program and the lock.

Prints "producer TID consumer TID" once both run, then runs for argv[1] s.
"""
import queue
import sys
import threading
import time

q = queue.Queue()
ids = {}
started = threading.Barrier(3)


def producer():
    ids["producer"] = threading.get_native_id()
    started.wait()
    while True:
        time.sleep(0.02)
        q.put(1)


def consumer():
    ids["consumer"] = threading.get_native_id()
    started.wait()
    while True:
        q.get()


for f in (producer, consumer):
    threading.Thread(target=f, daemon=True).start()
started.wait()
print("producer", ids["producer"], "consumer", ids["consumer"], flush=True)
time.sleep(float(sys.argv[1]))
