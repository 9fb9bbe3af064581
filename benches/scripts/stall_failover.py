#!/usr/bin/env python3
"""Three `concord` processes; the one leading the most groups gets a disk that stalls (its writes
throttled to a few a second, the block-I/O cgroup of `slow_disk.py`: run as root, cgroup v1)
while its groups sleep. One session is written over and over through another member, so the
stalled member is always inside a log write. Shows when the groups it led — asleep, and written
to by nobody — have leaders on the other members: a member stuck in a log write stops sending
keepalives, and its peers treat it as they would a crashed one.

Usage (release build first: cargo build --release -p concord-http):
  sudo python3 benches/scripts/stall_failover.py [--groups 64] [--write-iops 1]
      [--limit-secs 30] [--server-args '--slow-log-write-ms 0']

Prints the timeline and a JSON line {"case": "stall_failover", ...}; exits 1 if the stalled
member's groups still named it their leader after --limit-secs.
"""

import argparse
import json
import os
import tempfile
import threading
import time

from cluster_recovery import Member, call, free_ports, start_all, status, stop_all
from slow_disk import SlowDisk

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def led_by(view, node):
    return sorted(g["group"] for g in view["groups"] if g["leader"] == node)


def all_asleep(members):
    views = [status(m.address) for m in members]
    return all(v and all(g["asleep"] for g in v["groups"]) for v in views)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concord", default=os.path.join(ROOT, "target/release/concord"))
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--write-iops", type=int, default=1)
    parser.add_argument("--limit-secs", type=float, default=30.0)
    parser.add_argument("--server-args", default="",
                        help="more `concord serve` flags, e.g. '--slow-log-write-ms 0' to see "
                             "the silence alone, without the hand-over of a slow write's groups")
    args = parser.parse_args()

    # On the disk the repository is on (not a tmpfs): that is the disk the cgroup throttles.
    scratch = os.path.join(ROOT, "bench-scratch")
    os.makedirs(scratch, exist_ok=True)
    root = tempfile.mkdtemp(prefix="concord-stall-failover-", dir=scratch)
    disk = SlowDisk(root)
    ports = free_ports(3)
    cluster = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    members = [Member(args.concord, i + 1, cluster, os.path.join(root, str(i + 1)), args.groups,
                      args.server_args.split())
               for i in range(3)]
    stop = threading.Event()
    writer = victim = None
    result = {"case": "stall_failover", "groups": args.groups, "write_iops": args.write_iops,
              "server_args": args.server_args}
    try:
        start_all(members)
        deadline = time.time() + 120
        while not all_asleep(members):
            if time.time() > deadline:
                raise SystemExit("the groups never fell asleep")
            time.sleep(0.2)
        views = {m.node: status(m.address) for m in members}
        victim = max(members, key=lambda m: len(led_by(views[m.node], m.node)))
        healthy = next(m for m in members if m is not victim)
        victim_groups = led_by(views[healthy.node], victim.node)
        result.update({"victim": victim.node, "victim_groups": len(victim_groups)})
        print(f"every group asleep; node {victim.node} leads {len(victim_groups)} of "
              f"{args.groups}: its disk stalls now")

        # One session, written again and again through a healthy member: every member's log
        # takes each write (the stalled one's as leader or as follower).
        call(healthy.address, "POST", "/v1/sessions",
             json.dumps({"client_id": "stall-probe", "broker_id": "b"}))

        def write_again():
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    call(healthy.address, "PATCH", "/v1/sessions/stall-probe",
                         json.dumps({"connection_id": n}), timeout=10)
                except OSError:
                    pass

        disk.slow(victim.process.pid, args.write_iops)
        stalled_at = time.time()
        writer = threading.Thread(target=write_again)
        writer.start()
        first_stalled = moved = None
        longest_ms = 0
        while time.time() - stalled_at < args.limit_secs:
            at = time.time() - stalled_at
            try:
                mine = status(victim.address) or {}
            except OSError:
                mine = {}
            longest_ms = max(longest_ms, mine.get("log_write_in_progress_ms") or 0)
            if first_stalled is None and mine.get("log_write_stalled"):
                first_stalled = round(at, 2)
                print(f"{at:6.2f} s  node {victim.node} says its log write stalls")
            view = status(healthy.address)
            still = [g["group"] for g in view["groups"]
                     if g["group"] in victim_groups and g["leader"] in (0, victim.node)]
            if not still:
                moved = round(at, 2)
                print(f"{at:6.2f} s  every group node {victim.node} led has a leader elsewhere")
                break
            time.sleep(0.05)
        result.update({"stalled_reported_secs": first_stalled, "moved_secs": moved,
                       "longest_write_ms": longest_ms})
    finally:
        stop.set()
        if victim is not None and victim.process is not None:
            disk.restore(victim.process.pid)
        disk.close()
        if writer is not None:
            writer.join()
        stop_all(members, root)
    print(json.dumps(result))
    raise SystemExit(0 if result.get("moved_secs") is not None else 1)


if __name__ == "__main__":
    main()
