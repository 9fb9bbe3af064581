#!/usr/bin/env python3
"""What a backup and a restore of one `concord` node holding many sessions cost: loads
`--sessions` into a node of 8 groups, then `--rounds` times: `concord backup` from it while it
serves (seconds, file bytes, the server's resident memory above what it held before, the
server's CPU), `concord restore` of that file into a new data directory (seconds, the restore's
peak resident memory), and a node started on the restored directory (seconds until `/readyz`
answers 200; 20,000 random sessions read back, every one must be there).

Usage (release build first):
  python3 benches/scripts/backup_restore.py --concord target/release/concord \\
      --sessions 1000000 --rounds 5

Prints a JSON line per round ({"case": "backup_restore", ...}) and the medians.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import threading
import time

from cluster_recovery import Member, call, free_ports, load, stale_statuses

READ_BACK = 20_000


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """The highest resident memory of `pid`, sampled every 10 ms until stopped."""

    def __init__(self, pid):
        self.pid, self.highest, self.running = pid, rss_bytes(pid), True
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while self.running:
            self.highest = max(self.highest, rss_bytes(self.pid))
            time.sleep(0.01)

    def stop(self):
        self.running = False
        self.thread.join()
        return self.highest


def timed_child(argv):
    """Runs `argv`: (seconds, its peak resident bytes, its output); fails on a non-zero exit."""
    began = time.time()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    secs = time.time() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{argv[1]} failed: {output}")
    return secs, usage.ru_maxrss * 1024, output


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="wal", help="of the node and of the restores")
    parser.add_argument("--scratch-dir", default="bench-scratch")
    args = parser.parse_args()

    os.makedirs(args.scratch_dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="backup-restore-", dir=args.scratch_dir)
    server_args = ["--backend", args.backend]
    source = Member(args.concord, 1, f"1=127.0.0.1:{free_ports(1)[0]}",
                    os.path.join(root, "source"), 8, server_args)
    source.stderr = open(os.path.join(root, "source.log"), "a")
    results = []
    chooser = random.Random(1)
    try:
        source.start()
        source.wait_listening()
        while call(source.address, "GET", "/readyz")[0] != 200:
            time.sleep(0.01)
        began = time.time()
        load([source], args.sessions, threads=4)
        print(f"loaded {args.sessions} sessions in {time.time() - began:.1f} s", flush=True)
        for round_number in range(args.rounds):
            backup = os.path.join(root, f"round-{round_number}.backup")
            before_rss = rss_bytes(source.process.pid)
            before_cpu = source.cpu_secs()
            sampler = RssSampler(source.process.pid)
            backup_secs, _, _ = timed_child(
                [args.concord, "backup", "--output", backup,
                 "--endpoint", f"http://{source.address}"])
            server_rss_above = sampler.stop() - before_rss
            server_cpu = source.cpu_secs() - before_cpu

            restored = os.path.join(root, f"restored-{round_number}")
            restore_secs, restore_rss, _ = timed_child(
                [args.concord, "restore", "--input", backup, "--data-dir", restored,
                 "--backend", args.backend])

            node = Member(args.concord, 1, f"1=127.0.0.1:{free_ports(1)[0]}", restored, 8,
                          server_args)
            node.stderr = open(os.path.join(root, f"restored-{round_number}.log"), "a")
            began = time.time()
            node.start()
            node.wait_listening()
            while call(node.address, "GET", "/readyz")[0] != 200:
                time.sleep(0.01)
            ready_secs = time.time() - began
            ids = [f"device/{chooser.randrange(args.sessions):08}" for _ in range(READ_BACK)]
            missing = sum(1 for s in stale_statuses(node, ids).values() if s != 200)
            node.stop()
            result = {"case": "backup_restore", "round": round_number,
                      "sessions": args.sessions, "backend": args.backend,
                      "backup_secs": round(backup_secs, 3),
                      "backup_bytes": os.path.getsize(backup),
                      "server_rss_above_bytes": server_rss_above,
                      "server_cpu_secs": round(server_cpu, 3),
                      "restore_secs": round(restore_secs, 3),
                      "restore_peak_rss_bytes": restore_rss,
                      "restored_ready_secs": round(ready_secs, 3),
                      "missing": missing}
            print(json.dumps(result), flush=True)
            results.append(result)
            os.remove(backup)
            shutil.rmtree(restored)
            if missing:
                raise SystemExit(f"{missing} of {READ_BACK} sessions read back missing")
    finally:
        source.stop()
    for key in ("backup_secs", "server_rss_above_bytes", "server_cpu_secs", "restore_secs",
                "restore_peak_rss_bytes", "restored_ready_secs"):
        values = [r[key] for r in results]
        print(f"{key}: median {statistics.median(values)} ({min(values)}–{max(values)})",
              flush=True)
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
