#!/usr/bin/env python3
"""The floor under a replicated write over loopback TCP: one bare round trip between two
processes (40 bytes each way, blocking sockets, TCP_NODELAY), 20,000 times.

Usage: python3 benches/scripts/loopback_round_trip.py

Prints the p50 and p99, and a JSON line {"case": "loopback_round_trip", ...}.
"""

import json
import os
import socket
import time

ROUND_TRIPS = 20_000
MESSAGE = b"x" * 40


def echo(port):
    """The other process: sends back whatever arrives, until the connection closes."""
    peer = socket.create_connection(("127.0.0.1", port))
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = peer.recv(64)
        if not data:
            os._exit(0)
        peer.sendall(data)


def main():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    child = os.fork()
    if child == 0:
        echo(port)
    connection, _ = listener.accept()
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    took_us = []
    for _ in range(ROUND_TRIPS):
        started = time.perf_counter_ns()
        connection.sendall(MESSAGE)
        received = 0
        while received < len(MESSAGE):
            received += len(connection.recv(64))
        took_us.append((time.perf_counter_ns() - started) / 1000)
    connection.close()
    os.waitpid(child, 0)
    took_us.sort()
    p50 = took_us[len(took_us) // 2]
    p99 = took_us[int(len(took_us) * 0.99)]
    print(f"loopback round trip between two processes: p50 {p50:.1f} us, p99 {p99:.1f} us")
    print(json.dumps({"case": "loopback_round_trip", "round_trips": ROUND_TRIPS,
                      "p50_us": round(p50, 1), "p99_us": round(p99, 1)}))


if __name__ == "__main__":
    main()
