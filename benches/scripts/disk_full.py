#!/usr/bin/env python3
"""Three `concord` processes, one of them (node 1) with its data directory on a small file
system of its own (a tmpfs the script mounts: run as root), and writes through every member
until node 1's disk is full. Checks that:

  - node 1 stops by itself, with an error naming the full disk, while the others go on
    answering writes;
  - started again on the disk still full, it stops again the same way;
  - once its file system is grown, it starts, catches up, and every create answered 201 is
    on every member (a stale read of each member's own state), each group's digest the same
    everywhere.

Usage (release build first: cargo build --release -p concord-http):
  sudo python3 benches/scripts/disk_full.py --size-mib 120

Prints each step and a JSON line {"case": "disk_full", ...}; exits 1 if a check failed.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

from cluster_chaos import check, converged, start_cluster
from cluster_recovery import Member, call, free_ports, member_ready, stop_all

# A session of about 3 KiB: a 3,000-byte will payload, base64.
WILL = {"topic": "t/" + "x" * 100, "payload_base64": "eHh4" * 1000, "qos": 1}
FULL = "No space left on device"


class Written:
    """The creates answered 201, in the shape `check` reads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.present = set()
        self.deleted = set()
        # Creates answered as safe to retry: `check` reads them; these writers keep none.
        self.not_created = set()
        self.codes = {}


def writer(index, members, written, stop, prefix="full", last_will=WILL):
    """Creates sessions named `prefix`-`index`-n through random live members until `stop` or
    until none is live, each with `last_will` (none if None); notes the answers in `written`."""
    chooser = random.Random(index)
    n = 0
    while not stop.is_set():
        live = [m for m in members if m.process.poll() is None]
        if not live:
            return
        member = chooser.choice(live)
        n += 1
        client_id = f"{prefix}-{index}-{n}"
        session = {"client_id": client_id, "broker_id": "b"}
        if last_will is not None:
            session["last_will"] = last_will
        body = json.dumps(session)
        try:
            code, _ = call(member.address, "POST", "/v1/sessions", body, timeout=10)
        except OSError as error:
            code = type(error).__name__
        with written.lock:
            written.codes[code] = written.codes.get(code, 0) + 1
            if code == 201:
                written.present.add(client_id)


def stops_on_full_disk(member, log_path, seconds, when):
    """Waits up to `seconds` for `member` to exit; returns the problems: none if it exited with
    an error and its log (at `log_path`) names the full disk."""
    try:
        code = member.process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        code = None
    with open(log_path) as log:
        said_full = FULL in log.read()
    print(f"{when}: node 1 exited with {code}, its log names the full disk: {said_full}",
          flush=True)
    if code in (None, 0) or not said_full:
        return [f"{when}: node 1 exited with {code}, full disk named: {said_full}"]
    return []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--size-mib", type=int, default=120)
    parser.add_argument("--writers", type=int, default=8)
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="concord-disk-full-")
    small = os.path.join(root, "small")
    os.makedirs(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.size_mib}m", "tmpfs", small],
                   check=True)
    ports = free_ports(3)
    flag = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
    dirs = [os.path.join(small, "1"), os.path.join(root, "2"), os.path.join(root, "3")]
    members = [Member(args.concord, i + 1, flag, dirs[i], args.groups) for i in range(3)]
    log_path = os.path.join(root, "node-1.log")
    members[0].stderr = open(log_path, "w")
    written = Written()
    stop = threading.Event()
    threads = []
    problems = []
    result = {}
    try:
        start_cluster(members)
        threads = [threading.Thread(target=writer, args=(i, members, written, stop))
                   for i in range(args.writers)]
        for t in threads:
            t.start()
        started = time.time()
        problems += stops_on_full_disk(members[0], log_path, 600, "writing")
        result["full_after_secs"] = round(time.time() - started, 1)
        answered_before = len(written.present)
        time.sleep(3)
        result["answered_while_node_1_down"] = len(written.present) - answered_before
        print(f"the others answered {result['answered_while_node_1_down']} creates in 3 s "
              "without node 1", flush=True)
        if result["answered_while_node_1_down"] == 0:
            problems.append("the other members answered no create while node 1 was down")
        stop.set()
        for t in threads:
            t.join()

        members[0].stderr = open(log_path, "w")
        members[0].start()
        members[0].wait_listening()
        problems += stops_on_full_disk(members[0], log_path, 120,
                                       "started again on the full disk")

        subprocess.run(["mount", "-o", f"remount,size={args.size_mib * 4}m", small], check=True)
        members[0].stderr = sys.stderr
        members[0].start()
        members[0].wait_listening()
        if not member_ready(members[0]):
            problems.append("node 1 not ready within 120 s (or exited) once its disk was grown")
        elif not converged(members):
            problems.append("the members' applied indexes did not meet within 180 s")
        else:
            problems += check(members, written)
    finally:
        stop.set()
        for t in threads:
            t.join()
        stop_all(members, root, keep_data=True)
        subprocess.run(["umount", small], check=False)
        if not problems:
            subprocess.run(["rm", "-rf", root], check=False)
        else:
            print(f"data directories of nodes 2 and 3 kept in {root}", file=sys.stderr)

    print(f"answers: {written.codes}; checked {len(written.present)} creates on every member; "
          f"problems: {len(problems)}")
    for problem in problems[:20]:
        print("  " + problem)
    print(json.dumps({"case": "disk_full", "size_mib": args.size_mib, "groups": args.groups,
                      **result, "answered": len(written.present), "problems": len(problems)}))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
