#!/usr/bin/env python3
"""How long one `concord` node holding many sessions takes to start again: loads `--sessions`
into a node of 8 groups, then restarts it `--rounds` times per binary (each stop a SIGTERM, so
the page cache is as a clean stop leaves it), the binaries alternated and their order swapped
every round; for each start, the seconds until `/readyz` answers 200 and to read back 20,000
random sessions (stale) after it.

Usage (release builds first):
  python3 benches/scripts/restart_time.py --concord target/release/concord,/tmp/old/concord \\
      --sessions 1000000 --rounds 5

Prints a JSON line per start ({"case": "restart_time", ...}) and the medians per binary.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time

from cluster_recovery import Member, call, free_ports, load, stale_statuses

READ_BACK = 20_000


def start(member, binary):
    """Starts `member` from `binary`; the seconds until it is ready."""
    member.binary = binary
    began = time.time()
    member.start()
    member.wait_listening()
    while call(member.address, "GET", "/readyz")[0] != 200:
        time.sleep(0.01)
    return time.time() - began


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord",
                        help="comma-separated binaries to alternate")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scratch-dir", default="bench-scratch")
    args = parser.parse_args()

    binaries = args.concord.split(",")
    os.makedirs(args.scratch_dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="restart-time-", dir=args.scratch_dir)
    port = free_ports(1)[0]
    member = Member(binaries[0], 1, f"1=127.0.0.1:{port}", os.path.join(root, "1"), 8)
    member.stderr = open(os.path.join(root, "node-1.log"), "a")
    ready = {binary: [] for binary in binaries}
    try:
        start(member, binaries[0])
        began = time.time()
        load([member], args.sessions, threads=4)
        print(f"loaded {args.sessions} sessions in {time.time() - began:.1f} s", flush=True)
        member.stop()
        chooser = random.Random(1)
        for round_number in range(args.rounds):
            order = binaries if round_number % 2 == 0 else binaries[::-1]
            for binary in order:
                ready_secs = start(member, binary)
                ids = [f"device/{chooser.randrange(args.sessions):08}" for _ in range(READ_BACK)]
                began = time.time()
                statuses = stale_statuses(member, ids)
                read_secs = time.time() - began
                missing = sum(1 for status in statuses.values() if status != 200)
                member.stop()
                ready[binary].append(ready_secs)
                print(json.dumps({"case": "restart_time", "binary": binary,
                                  "round": round_number, "sessions": args.sessions,
                                  "ready_secs": round(ready_secs, 3),
                                  "read_back_secs": round(read_secs, 3),
                                  "missing": missing}), flush=True)
                if missing:
                    raise SystemExit(f"{missing} of {READ_BACK} sessions read back missing")
    finally:
        member.stop()
    for binary, secs in ready.items():
        print(f"{binary}: ready after {statistics.median(secs):.2f} s (median of {len(secs)}; "
              f"{min(secs):.2f}–{max(secs):.2f})", flush=True)
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
