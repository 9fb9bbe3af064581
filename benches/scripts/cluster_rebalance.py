#!/usr/bin/env python3
"""Three `concord` processes on loopback: how long group leaderships take to spread again
after a member restarts.

Each run stops one member gracefully (SIGTERM: it hands its leaderships to the others first),
starts it again on its data, and measures, from the moment it is ready, how long until every
member leads at most its share of the groups (the group count over three, rounded up), as
the restarted member's `/v1/status` reports the leaders. The time counts from the restart
(the member's start), since a member may take leaderships before it reports ready; the
member's readiness is reported beside it. No load runs: the time is the balance's own.

Usage (release build first: cargo build --release -p concord-http):
  python3 benches/scripts/cluster_rebalance.py --groups 1024 --runs 3
  python3 benches/scripts/cluster_rebalance.py --groups 1024 --server-args '--raft-workers 2'

Prints a line per run and a JSON line per run ({"case": "rebalance", ...}).
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_recovery import start_all, status, stop_all, three_members, wait_ready  # noqa: E402


def leads(member):
    """How many groups each node leads, as `member` knows the leaders (0: no leader)."""
    counts = {}
    for group in status(member.address)["groups"]:
        counts[group["leader"]] = counts.get(group["leader"], 0) + 1
    return counts


def balanced(counts, nodes, groups):
    share = -(-groups // len(nodes))
    return counts.get(0, 0) == 0 and all(counts.get(node, 0) <= share for node in nodes)


def wait_balanced(member, nodes, groups, timeout_secs, since=None):
    """Seconds from `since` (now when None) until `member` sees every node within its share,
    or None at the timeout."""
    started = since or time.time()
    while time.time() - started < timeout_secs:
        if balanced(leads(member), nodes, groups):
            return time.time() - started
        time.sleep(0.1)
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--groups", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout-secs", type=float, default=900.0,
                        help="give up on a run after this long")
    parser.add_argument("--server-args", default="",
                        help="more `concord serve` flags for every member, e.g. "
                             "'--raft-workers 2'")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="concord-rebalance-")
    members = three_members(args.concord, root, args.groups, args.server_args.split())
    nodes = [m.node for m in members]
    try:
        start_all(members)
        first = wait_balanced(members[0], nodes, args.groups, args.timeout_secs)
        print(f"started: leaderships spread {first} s after ready", flush=True)
        for run in range(1, args.runs + 1):
            restarted = members[(run - 1) % 3]
            restarted.stop()
            started = time.time()
            restarted.start("existing")
            restarted.wait_listening()
            wait_ready(members, timeout=120)
            ready = time.time() - started
            before = leads(restarted)
            took = wait_balanced(restarted, nodes, args.groups, args.timeout_secs, started)
            after = leads(restarted)
            shown = "never (timed out)" if took is None else f"{took:.1f} s"
            print(f"rebalance run {run}: node {restarted.node} ready {ready:.1f} s after its "
                  f"start, leading {before.get(restarted.node, 0)} of {args.groups} groups "
                  f"then; every member within its share {shown} after the start; leaders "
                  f"then {after}", flush=True)
            print(json.dumps({"case": "rebalance", "run": run, "groups": args.groups,
                              "server_args": args.server_args,
                              "restarted_node": restarted.node, "ready_secs": ready,
                              "led_at_ready": before.get(restarted.node, 0),
                              "balanced_secs": took}), flush=True)
    finally:
        stop_all(members, root)


if __name__ == "__main__":
    main()
