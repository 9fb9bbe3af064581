#!/usr/bin/env python3
"""Three `concord` processes, one of them (node 1) on a disk that fails on command, and writes
through every member all along. `faulty_disk.c` (`faulty_disk.py` builds it with the machine's
C compiler), loaded into node 1 with LD_PRELOAD, answers EIO to the calls chosen, on the files
under node 1's data directory only: what a process sees of a disk that fails. Checks that:

  - writes and syncs failing: node 1 stops by itself, with an error naming the failed I/O and
    without a panic, while the others go on answering creates;
  - started again on a healthy disk, it catches up; then syncs alone failing (writes still
    land in the page cache, as when a disk fails its flushes): it stops the same way, so a
    failed sync is never retried and taken for durable;
  - started while reads fail, it refuses to start, with an error naming the failed I/O and
    without a panic;
  - reads failing while it serves linearizable reads of answered creates: no read answers 404
    for one of them, and node 1 either goes on or stops with the error named, never a panic
    (the members run with a state cache of 1 MiB, so that reads of the state reach the disk;
    the run prints how many the disk failed);
  - healthy again, it starts, catches up, and every create answered 201 is on every member (a
    stale read of each member's own state), each group's digest the same everywhere.

Usage (release build first: cargo build --release -p concord-http; needs cc):
  python3 benches/scripts/disk_errors.py
  python3 benches/scripts/disk_errors.py --server-args '--backend redb'

Prints each step and a JSON line {"case": "disk_errors", ...}; exits 1 if a check failed (the
members' data directories are then kept and named).
"""

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time

from cluster_chaos import check, converged, start_cluster
from cluster_recovery import call, member_ready, stop_all, three_members
from disk_full import Written, writer
from faulty_disk import FAIL_READS, FAIL_SYNCS, FAIL_WRITES, FaultyDisks

IO_ERROR = "Input/output error"


def stops_on_io_error(member, log_path, seconds, when):
    """Waits up to `seconds` for `member` to exit; returns the problems: none if it exited with
    an error, its log names the failed I/O and nothing in it panicked. One still running after
    `seconds` is killed. Prints how long it took and any step of its stop it said was slow."""
    waited_from = time.monotonic()
    try:
        code = member.process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        code = None
        member.kill()
    waited_secs = time.monotonic() - waited_from
    with open(log_path) as log:
        text = log.read()
    named, panicked = IO_ERROR in text, "panicked" in text
    print(f"{when}: node 1 exited with {code} after {waited_secs:.1f} s; its log names the "
          f"I/O error: {named}; panicked: {panicked}", flush=True)
    for line in text.splitlines():
        if IO_ERROR in line:
            print(f"    first line naming it: {line.strip()[:300]}", flush=True)
            break
    for line in text.splitlines():
        if "slow to stop" in line or "slow to close" in line:
            print(f"    {line.strip()[:300]}", flush=True)
    if code in (None, 0) or not named or panicked:
        return [f"{when}: node 1 exited with {code}, I/O error named: {named}, "
                f"panicked: {panicked}"]
    return []


def reader(member, written, stop, codes):
    """Linearizable reads through `member` of creates answered 201, until `stop`; counts the
    answers in `codes` and returns the reads that answered 404 (an answered create lost)."""
    chooser = random.Random(7)
    with written.lock:
        answered = sorted(written.present)
    lost = []
    while not stop.is_set() and member.process.poll() is None:
        client_id = chooser.choice(answered)
        try:
            code, _ = call(member.address, "GET",
                           f"/v1/sessions/{client_id}?consistency=linearizable", timeout=10)
        except OSError as error:
            code = type(error).__name__
        codes[code] = codes.get(code, 0) + 1
        if code == 404:
            lost.append(client_id)
    return lost


def reads_fail_while_serving(member, disks, written, log_path, seconds):
    """Fails `member`'s reads for `seconds` while it serves linearizable reads; returns the
    problems and how many reads the disk failed."""
    codes = {}
    stop = threading.Event()
    lost = []
    thread = threading.Thread(target=lambda: lost.extend(reader(member, written, stop, codes)))
    errors_before = disks.errors_answered(member)
    disks.fail(member, FAIL_READS)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    disks.fail(member, 0)
    failed_reads = disks.errors_answered(member) - errors_before
    print(f"reads failing while serving: {failed_reads} reads failed by the disk; "
          f"answers {codes}", flush=True)
    problems = [f"a linearizable read of answered create {c} through node 1 answered 404"
                for c in lost[:5]]
    if member.process.poll() is not None:
        problems += stops_on_io_error(member, log_path, 0, "reads failing while serving")
    else:
        with open(log_path) as log:
            if "panicked" in log.read():
                problems.append("reads failing while serving: node 1 panicked")
    return problems, failed_reads


def others_answer(written, seconds):
    """Creates answered in the next `seconds` (by the members still up)."""
    before = len(written.present)
    time.sleep(seconds)
    return len(written.present) - before


def restart(member, log_path, listens=True):
    """Starts `member` again, its log to `log_path`; waits until it listens if it `listens`."""
    member.stderr = open(log_path, "w")
    member.start()
    if listens:
        member.wait_listening()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--load-secs", type=float, default=5,
                        help="seconds of writes before each fault")
    parser.add_argument("--server-args", default="",
                        help="more `concord serve` flags for every member, e.g. '--backend redb'")
    args = parser.parse_args()
    server_args = shlex.split(args.server_args)
    if "mem" in server_args or "--backend=mem" in server_args:
        parser.error("the mem backend keeps nothing on disk: there is no disk to fail")

    root = tempfile.mkdtemp(prefix="concord-disk-errors-")
    disks = FaultyDisks(root)
    members = three_members(args.concord, root, args.groups,
                            ["--state-cache-mib", "1", *server_args])
    disks.attach(members[0])
    logs = {step: os.path.join(root, f"node-1-{step}.log")
            for step in ("first", "healthy", "reads", "last", "after_reads")}
    members[0].stderr = open(logs["first"], "w")
    written = Written()
    stop = threading.Event()
    threads = []
    problems = []
    result = {}
    finished = False
    try:
        start_cluster(members)
        threads = [threading.Thread(target=writer,
                                    args=(i, members, written, stop, "eio", None))
                   for i in range(args.writers)]
        for t in threads:
            t.start()

        time.sleep(args.load_secs)
        print("node 1's writes and syncs fail", flush=True)
        disks.fail(members[0], FAIL_WRITES | FAIL_SYNCS)
        problems += stops_on_io_error(members[0], logs["first"], 60, "writes and syncs failing")
        result["answered_without_node_1"] = others_answer(written, 3)
        print(f"the others answered {result['answered_without_node_1']} creates in 3 s "
              "without node 1", flush=True)
        if result["answered_without_node_1"] == 0:
            problems.append("the other members answered no create while node 1 was down")

        disks.fail(members[0], 0)
        restart(members[0], logs["healthy"])
        if not member_ready(members[0]):
            problems.append("node 1 not ready within 120 s (or exited) on a healthy disk")
        time.sleep(args.load_secs)
        print("node 1's syncs fail (its writes do not)", flush=True)
        disks.fail(members[0], FAIL_SYNCS)
        problems += stops_on_io_error(members[0], logs["healthy"], 60, "syncs failing")

        disks.fail(members[0], FAIL_READS)
        print("node 1 started while its reads fail", flush=True)
        restart(members[0], logs["reads"], listens=False)
        problems += stops_on_io_error(members[0], logs["reads"], 120, "reads failing at start")

        disks.fail(members[0], 0)
        restart(members[0], logs["last"])
        if not member_ready(members[0]):
            problems.append("node 1 not ready within 120 s (or exited) once its disk was healthy again")
        time.sleep(args.load_secs)
        found, result["reads_failed_while_serving"] = reads_fail_while_serving(
            members[0], disks, written, logs["last"], args.load_secs)
        problems += found
        if members[0].process.poll() is not None:
            restart(members[0], logs["after_reads"])
            if not member_ready(members[0]):
                problems.append("node 1 not ready within 120 s (or exited) after its reads failed")
            time.sleep(args.load_secs)
        stop.set()
        for t in threads:
            t.join()
        result["errors_injected"] = disks.errors_answered(members[0])
        if not problems:
            if not converged(members):
                problems.append("the members' applied indexes did not meet within 180 s")
            else:
                problems += check(members, written)
        finished = True
    finally:
        stop.set()
        for t in threads:
            t.join()
        stop_all(members, root, keep_data=True)
        if finished and not problems:
            subprocess.run(["rm", "-rf", root], check=False)
        else:
            print(f"data directories and node 1's logs kept in {root}", file=sys.stderr)

    print(f"answers: {written.codes}; EIOs answered to node 1: {result.get('errors_injected')}; "
          f"checked {len(written.present)} creates on every member; problems: {len(problems)}")
    for problem in problems[:20]:
        print("  " + problem)
    print(json.dumps({"case": "disk_errors", "groups": args.groups,
                      "server_args": args.server_args, **result,
                      "answered": len(written.present), "problems": len(problems)}))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
