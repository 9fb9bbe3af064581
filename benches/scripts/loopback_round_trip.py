#!/usr/bin/env python3
"""The floor under a replicated write over loopback TCP: one bare round trip between two
processes (40 bytes each way, blocking sockets, TCP_NODELAY), 20,000 times.

With --watch both processes read without blocking, in a loop, instead: nobody sleeps, so no
arriving message has to wake its reader. The difference from the blocking run is what a
wake-up costs on this machine (each round trip has two); watching takes a core per process.

With --one-cpu both processes run on the first CPU the process may use: each wakes the other
on the CPU it runs on itself. Against the run across CPUs this shows what it costs to wake a
reader on another CPU that had nothing to do (on a virtual machine, an idle virtual CPU is
halted, and the host must run it again).

Usage: python3 benches/scripts/loopback_round_trip.py [--watch] [--one-cpu]

Prints the p50 and p99, and a JSON line {"case": "loopback_round_trip", "watch": ..., ...}.
"""

import argparse
import json
import os
import socket
import time

ROUND_TRIPS = 20_000
MESSAGE = b"x" * 40


def receive(connection, watch):
    """What arrives next (b"" once the peer closed): waiting for it, or watching for it."""
    while True:
        try:
            return connection.recv(64)
        except BlockingIOError:
            if not watch:
                raise


def prepare(connection, watch):
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # A nonblocking socket's sendall still sends it all: 40 bytes always fit.
    connection.setblocking(not watch)


def echo(port, watch):
    """The other process: sends back whatever arrives, until the connection closes."""
    peer = socket.create_connection(("127.0.0.1", port))
    prepare(peer, watch)
    while True:
        data = receive(peer, watch)
        if not data:
            os._exit(0)
        peer.sendall(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watch", action="store_true",
                        help="read without blocking, in a loop (no wake-ups)")
    parser.add_argument("--one-cpu", action="store_true",
                        help="run both processes on one CPU (no wake-up crosses CPUs)")
    args = parser.parse_args()
    watch = args.watch
    if args.one_cpu:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    child = os.fork()
    if child == 0:
        echo(port, watch)
    connection, _ = listener.accept()
    prepare(connection, watch)
    took_us = []
    for _ in range(ROUND_TRIPS):
        started = time.perf_counter_ns()
        connection.sendall(MESSAGE)
        received = 0
        while received < len(MESSAGE):
            received += len(receive(connection, watch))
        took_us.append((time.perf_counter_ns() - started) / 1000)
    connection.close()
    os.waitpid(child, 0)
    took_us.sort()
    p50 = took_us[len(took_us) // 2]
    p99 = took_us[int(len(took_us) * 0.99)]
    how = "readers watching" if watch else "readers waiting"
    where = "on one CPU" if args.one_cpu else "on any CPU"
    print(f"loopback round trip between two processes {where}, {how}: "
          f"p50 {p50:.1f} us, p99 {p99:.1f} us")
    print(json.dumps({"case": "loopback_round_trip", "watch": watch, "one_cpu": args.one_cpu,
                      "round_trips": ROUND_TRIPS, "p50_us": round(p50, 1),
                      "p99_us": round(p99, 1)}))


if __name__ == "__main__":
    main()
