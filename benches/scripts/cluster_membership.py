#!/usr/bin/env python3
"""How long a member's replacement takes at many groups: three `concord` processes with `--groups
N`, then a fourth started with `--initial-cluster-state existing`, added as a learner, caught
up, promoted, and removed again, each step through member 1's admin API (what `concord member
add|promote|remove` call). Prints a line per step and run, and a JSON line per run:

    {"case": "membership", "run": 1, "groups": 4096, "add_secs": ..., "catch_up_secs": ...,
     "installs": ..., "installing_secs": ..., "fetches": {"fetched": {"count": ..., "secs": ...},
     ...}, "promote_secs": ..., "remove_secs": ..., "total_secs": ...}

Each run starts a new cluster in a temporary directory and stops every process it started.

    python3 benches/scripts/cluster_membership.py --groups 4096 --runs 3
"""

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_recovery import Member, call, fetches, free_ports, installs  # noqa: E402


def wait_ready(member, timeout_secs=180):
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        if member.process.poll() is not None:
            raise RuntimeError(f"node {member.node} exited with {member.process.returncode}")
        try:
            code, _ = call(member.address, "GET", "/readyz", timeout=5)
            if code == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"node {member.node} not ready within {timeout_secs} s")


def admin(member, method, path, body=None):
    """A membership call through `member`, asked again while it answers 503 (a group between
    leaders); returns the seconds it took."""
    started = time.monotonic()
    while True:
        code, answer = call(member.address, method, path, body, timeout=300)
        if code == 200:
            return time.monotonic() - started
        if code != 503 or time.monotonic() - started > 300:
            raise RuntimeError(f"{method} {path}: {code} {answer}")
        time.sleep(0.1)


def one_run(args, run, root):
    ports = free_ports(4)
    addresses = {node: f"127.0.0.1:{port}" for node, port in zip(range(1, 5), ports)}
    initial = ",".join(f"{node}={addresses[node]}" for node in (1, 2, 3))
    server_args = shlex.split(args.server_args)
    members = [Member(args.concord, node, initial, os.path.join(root, str(node)), args.groups,
                      server_args) for node in (1, 2, 3)]
    newcomer = Member(args.concord, 4, f"{initial},4={addresses[4]}",
                      os.path.join(root, "4"), args.groups, server_args)
    try:
        for member in members:
            member.start()
        for member in members:
            member.wait_listening()
        for member in members:
            wait_ready(member)
        newcomer.start("existing")
        newcomer.wait_listening()
        add = admin(members[0], "POST", "/v1/cluster/members",
                    json.dumps({"node_id": 4, "raft_addr": addresses[4]}))
        started = time.monotonic()
        wait_ready(newcomer)
        catch_up = time.monotonic() - started
        installed, installing_secs = installs(newcomer)
        fetched = fetches(newcomer)
        promote = admin(members[0], "POST", "/v1/cluster/members/4/promote")
        remove = admin(members[0], "DELETE", "/v1/cluster/members/4")
    finally:
        for member in members + [newcomer]:
            member.stop()
    total = add + catch_up + promote + remove
    print(f"run {run}: {args.groups} groups: added in {add:.2f} s, caught up in "
          f"{catch_up:.2f} s ({installed} snapshots installed, {installing_secs:.2f} s "
          f"installing), promoted in {promote:.2f} s, removed in {remove:.2f} s; "
          f"{total:.2f} s in all; fetches (count, mean ms): "
          f"{ {k: (n, round(secs * 1e3 / n, 2) if n else None) for k, (n, secs) in fetched.items()} }",
          flush=True)
    print(json.dumps({"case": "membership", "run": run, "groups": args.groups,
                      "add_secs": add, "catch_up_secs": catch_up, "installs": installed,
                      "installing_secs": installing_secs,
                      "fetches": {k: {"count": n, "secs": secs} for k, (n, secs) in fetched.items()},
                      "promote_secs": promote,
                      "remove_secs": remove, "total_secs": total}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--groups", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--server-args", default="",
                        help="more `concord serve` flags for every member")
    args = parser.parse_args()
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="concord-membership-") as root:
            one_run(args, run, root)


if __name__ == "__main__":
    main()
