"""Blocked time with a split built in, for sonde offcpu's Python test: a
worker thread waits in time.sleep (50 ms), a socket recv (100 ms, until a
helper thread sends) and a threading.Lock (150 ms, until a helper releases
it), under three named functions: 1:2:3. Long enough that a busy host's
wake-up latency (a few ms per wait, two wake-ups for the helpers' waits)
moves the shares by under 2 points. The helpers are told to go by
semaphores, which never block the worker. Runs argv[1] seconds."""
import socket
import sys
import threading
import time


def sleeper():
    time.sleep(0.050)


def receiver(a, go):
    go.release()
    a.recv(1)


def locker(lock, go):
    lock.acquire()
    go.release()
    lock.acquire()
    lock.release()


def sender(b, go):
    while True:
        go.acquire()
        time.sleep(0.100)
        b.send(b"x")


def releaser(lock, go):
    while True:
        go.acquire()
        time.sleep(0.150)
        lock.release()


def worker(until):
    a, b = socket.socketpair()
    lock = threading.Lock()
    go_send, go_release = threading.Semaphore(0), threading.Semaphore(0)
    threading.Thread(target=sender, args=(b, go_send), daemon=True).start()
    threading.Thread(target=releaser, args=(lock, go_release), daemon=True).start()
    while time.monotonic() < until:
        sleeper()
        receiver(a, go_send)
        locker(lock, go_release)


if __name__ == "__main__":
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 1e9
    t = threading.Thread(target=worker, args=(time.monotonic() + secs,), name="worker")
    t.start()
    t.join()
