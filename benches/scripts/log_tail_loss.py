#!/usr/bin/env python3
"""A member whose raft log lost its tail while its state kept what it applied: three `concord`
processes (the WAL backend), creates written through member 1 all along; again and again a
follower-to-be is stopped (SIGTERM, which flushes its state), its WAL is cut at a random
point (everything after it zeroed, as a lost tail leaves it), and it is started again. Its
state is then ahead of its log: the log restarts after the state and the member must catch
up from its leader. After each round the writes pause and every member's digest of every
group must agree within `--converge-secs`; at the end every answered create must be readable
on every member.

Usage (release build first: cargo build --release -p concord-http):
  python3 benches/scripts/log_tail_loss.py --rounds 6 --seed 1

Prints a line per round and a JSON line ({"case": "log_tail_loss", ...}); exits non-zero if a
round did not converge or an answered create is missing.
"""

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

from cluster_recovery import (Member, call, free_ports, group_digest, stale_statuses, start_all,
                              stop_all)

GROUPS = 4


class Writer:
    """Creates sessions through one member, each with a new id, until paused."""

    def __init__(self, address):
        self.address = address
        self.next_id = 0
        self.answered = []
        self.running = False
        self.thread = None

    def start(self):
        self.running = True
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def pause(self):
        self.running = False
        self.thread.join()

    def run(self):
        while self.running:
            client_id = f"w{self.next_id}"
            self.next_id += 1
            body = json.dumps({"client_id": client_id})
            try:
                code, _ = call(self.address, "POST", "/v1/sessions", body, timeout=5)
            except OSError:
                continue
            if code == 201:
                self.answered.append(client_id)


def digests(members):
    """Each member's (applied index, sha256) of every group."""
    return [[group_digest(member.address, group) for group in range(GROUPS)]
            for member in members]


def cut_wal_tail(data_dir, rng):
    """Zeroes the newest WAL segment from a random point of its used part on; returns
    (cut, used) in bytes."""
    wal = os.path.join(data_dir, "log.wal")
    path = os.path.join(wal, sorted(os.listdir(wal))[-1])
    with open(path, "rb") as segment:
        used = len(segment.read().rstrip(b"\0"))
    cut = rng.randint(min(100, used), used)
    with open(path, "r+b") as segment:
        segment.seek(cut)
        segment.write(b"\0" * (used - cut))
    return cut, used


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write-secs", type=float, default=2.0)
    parser.add_argument("--converge-secs", type=float, default=20.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    root = tempfile.mkdtemp(prefix="concord-log-tail-")
    ports = free_ports(3)
    spec = ",".join(f"{i + 1}=127.0.0.1:{port}" for i, port in enumerate(ports))
    members = [Member(args.concord, i + 1, spec, f"{root}/{i + 1}", GROUPS) for i in range(3)]
    for member in members:
        member.stderr = open(f"{root}/{member.node}.log", "a")
    unconverged = 0
    missing = 0
    writer = None
    try:
        start_all(members)
        writer = Writer(members[0].address)
        for round_index in range(args.rounds):
            writer.start()
            time.sleep(args.write_secs)
            victim = members[1 + round_index % 2]
            victim.stop()
            cut, used = cut_wal_tail(victim.data_dir, rng)
            victim.start()
            victim.wait_listening()
            time.sleep(args.write_secs)
            writer.pause()
            deadline = time.time() + args.converge_secs
            while True:
                rows = digests(members)
                if all(row == rows[0] for row in rows):
                    applied = [index for index, _ in rows[0]]
                    print(f"round {round_index}: node {victim.node}'s WAL cut at {cut} of "
                          f"{used} bytes; converged, applied {applied}", flush=True)
                    break
                if time.time() > deadline:
                    print(f"round {round_index}: node {victim.node}'s WAL cut at {cut} of "
                          f"{used} bytes; NOT converged: {rows}", flush=True)
                    unconverged += 1
                    break
                time.sleep(0.5)
        for member in members:
            statuses = stale_statuses(member, writer.answered)
            missing += sum(1 for code in statuses.values() if code != 200)
    finally:
        if writer and writer.running:
            writer.pause()
        stop_all(members, root)
    answered = len(writer.answered) if writer else 0
    print(f"{answered} creates answered, each checked on every member: {missing} missing; "
          f"{unconverged} of {args.rounds} rounds did not converge")
    print(json.dumps({"case": "log_tail_loss", "seed": args.seed, "rounds": args.rounds,
                      "creates_answered": answered, "missing": missing,
                      "unconverged_rounds": unconverged}))
    sys.exit(1 if missing or unconverged else 0)


if __name__ == "__main__":
    main()
