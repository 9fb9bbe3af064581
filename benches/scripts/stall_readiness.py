#!/usr/bin/env python3
"""One `concord` process under creates; its disk's writes throttled to a few a second for a
while (the block-I/O cgroup of `slow_disk.py`: run as root, cgroup v1); `/readyz` and
`/v1/status` read every 250 ms. Shows when the node says it is not ready (a log write running
longer than a second), that it stays so between the slow disk's writes, and when it is ready
again (five seconds after the last stalled write returned).

Usage (release build first: cargo build --release -p concord-http -p concord-bench):
  sudo python3 benches/scripts/stall_readiness.py [--write-iops 2] [--slow-from-secs 4]
      [--slow-for-secs 8] [--duration-secs 30]

Prints the timeline (only the lines where readiness or the stall flag changed, and the
throttle's start and end) and a JSON line {"case": "stall_readiness", ...}; exits 1 if the node
never said it was not ready during the throttle, or was not ready again by the end.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from cluster_recovery import call, free_ports, status
from slow_disk import SlowDisk

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def readyz(address):
    """`/readyz`'s status code, or the name of the error that kept it from answering."""
    try:
        return call(address, "GET", "/readyz", timeout=2)[0]
    except OSError as error:
        return type(error).__name__


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concord", default=os.path.join(ROOT, "target/release/concord"))
    parser.add_argument("--bench", default=os.path.join(ROOT, "target/release/concord-bench"))
    parser.add_argument("--write-iops", type=int, default=2)
    parser.add_argument("--slow-from-secs", type=float, default=4.0)
    parser.add_argument("--slow-for-secs", type=float, default=8.0)
    parser.add_argument("--duration-secs", type=float, default=30.0)
    args = parser.parse_args()

    # On the disk the repository is on (not a tmpfs): that is the disk the cgroup throttles.
    scratch = os.path.join(ROOT, "bench-scratch")
    os.makedirs(scratch, exist_ok=True)
    data = tempfile.mkdtemp(prefix="concord-stall-", dir=scratch)
    disk = SlowDisk(data)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    server = subprocess.Popen(
        [args.concord, "serve", "--data-dir", data, "--http-addr", address, "--log-level", "warn"],
        stdout=subprocess.DEVNULL)
    load = None
    timeline = []
    try:
        deadline = time.time() + 10
        while readyz(address) != 200:
            if time.time() > deadline or server.poll() is not None:
                sys.exit("the server did not become ready")
            time.sleep(0.1)
        load = subprocess.Popen(
            [args.bench, "http", "--address", address, "--connections", "8", "--workload",
             "create", "--duration-secs", str(int(args.duration_secs))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        start = time.time()
        slowed_at = restored_at = None
        previous = None
        while time.time() - start < args.duration_secs:
            at = time.time() - start
            if slowed_at is None and at >= args.slow_from_secs:
                disk.slow(server.pid, args.write_iops)
                slowed_at = at
                print(f"{at:6.2f} s  writes throttled to {args.write_iops} a second")
            if slowed_at is not None and restored_at is None \
                    and at >= args.slow_from_secs + args.slow_for_secs:
                disk.restore(server.pid)
                restored_at = at
                print(f"{at:6.2f} s  throttle lifted")
            ready = readyz(address)
            try:
                node = status(address) or {}
            except OSError:
                node = {}
            stalled = node.get("log_write_stalled")
            running_ms = node.get("log_write_in_progress_ms")
            timeline.append({"at": round(at, 2), "readyz": ready, "stalled": stalled,
                             "in_progress_ms": running_ms})
            if (ready, stalled) != previous:
                print(f"{at:6.2f} s  /readyz {ready}, log_write_stalled {stalled}, "
                      f"write in progress {running_ms} ms")
                previous = (ready, stalled)
            time.sleep(0.25)
    finally:
        disk.restore(server.pid)
        disk.close()
        if load is not None:
            load.wait()
        server.terminate()
        server.wait()
        subprocess.run(["rm", "-rf", data])

    during = [t for t in timeline if slowed_at is not None and t["at"] >= slowed_at
              and (restored_at is None or t["at"] <= restored_at)]
    first_not_ready = next((t["at"] for t in during if t["readyz"] != 200), None)
    not_ready_at = [t["at"] for t in timeline if t["readyz"] != 200]
    ready_again = next((t["at"] for t in timeline
                        if not_ready_at and t["at"] > not_ready_at[-1] and t["readyz"] == 200),
                       None)
    longest_ms = max((t["in_progress_ms"] or 0 for t in timeline), default=0)
    result = {"case": "stall_readiness", "write_iops": args.write_iops,
              "throttled_secs": [round(t, 2) if t is not None else None
                                 for t in (slowed_at, restored_at)],
              "first_not_ready_secs": first_not_ready,
              "ready_again_secs": ready_again, "longest_write_ms": longest_ms,
              "ready_at_end": timeline[-1]["readyz"] == 200 if timeline else False}
    print(json.dumps(result))
    ok = first_not_ready is not None and result["ready_at_end"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
