"""Backups taken while `cluster_chaos.py` fails members, and the last one restored and checked.

Every `--backup-every-secs` a thread runs `concord backup` (linearizable: a read barrier per
group) through a random live member. Before it starts, it notes what the writers had been told:
the sessions whose create was answered and whose delete was not sent, the deletes answered,
the creates answered as safe to retry, and the largest counter total answered. A backup may
fail while members fail (cut short by a kill, no quorum, a member paused past the client's
timeout): that is counted, not a problem. One that `concord backup` refuses as not whole
after the server sent all of it is a problem.

At the end the last backup written is restored (`concord restore`, into the cluster's backend,
or wal for mem) and served alone, and read through that node's own state:
  - every session created before the backup began, and not deleted since, is there;
  - every session whose delete was answered before it began is not, nor any create answered as
    safe to retry;
  - the counter holds at least the largest total answered before it began, and at most the
    cluster's final total.
"""

import os
import random
import re
import shutil
import subprocess
import threading
import time

from cluster_recovery import Member, call_raw, free_ports, member_ready, stale_statuses

# A client id no writer makes (theirs are `chaos-<writer>-<n>`).
NEVER_WRITTEN = "chaos-never-written"
# `concord backup` gives up a read after 60 s; this bounds a backup stuck on something else.
BACKUP_TIMEOUT_SECS = 180


class Backup:
    """One backup written whole, and what the writers had been told before it began."""

    def __init__(self, path, member, present, deleted, not_created, largest_total):
        self.path, self.member = path, member
        self.present, self.deleted, self.not_created = present, deleted, not_created
        self.largest_total = largest_total


class Backups:
    """The backup thread: `start()`, then `stop()`; `last` is the newest backup written whole,
    `counts` says how each attempt ended, `problems` what contradicted a promise."""

    def __init__(self, concord, cluster, ledger, root, every_secs, seed):
        self.concord, self.cluster, self.ledger = concord, cluster, ledger
        self.root, self.every_secs = root, every_secs
        self.chooser = random.Random(seed * 7919 + 17)  # its own stream: faults stay as seeded
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.last = None
        self.counts = {}
        self.problems = []
        self.taken = 0

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping.set()
        self.thread.join()

    def count(self, what):
        self.counts[what] = self.counts.get(what, 0) + 1

    def run(self):
        while not self.stopping.wait(self.every_secs):
            live = self.cluster.live()
            if live:
                self.take(self.chooser.choice(live))

    def take(self, address):
        self.taken += 1
        path = os.path.join(self.root, f"chaos-{self.taken}.backup")
        with self.ledger.lock:
            present = set(self.ledger.present)
            deleted = set(self.ledger.deleted)
            not_created = set(self.ledger.not_created)
            largest_total = max((total for _, _, total in self.ledger.increments), default=0)
        argv = [self.concord, "backup", "--output", path, "--endpoint", f"http://{address}"]
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=BACKUP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            self.count("stuck")
            self.problems.append(f"a backup through {address} ran past "
                                 f"{BACKUP_TIMEOUT_SECS} s")
            return
        if done.returncode != 0:
            if "not a whole backup" in done.stderr:
                self.problems.append(f"a backup through {address}: {done.stderr.strip()}")
            self.count(f"failed: {reason(done.stderr)}")
            lines = done.stderr.strip().splitlines() or ["no message"]
            print(f"backup {self.taken} through {address} failed after "
                  f"{time.monotonic() - started:.1f} s: {lines[-1]}", flush=True)
            return
        self.count("written")
        with self.ledger.lock:
            # A delete sent while the backup ran may or may not be in it.
            present &= self.ledger.present
        previous, self.last = self.last, Backup(path, address, present, deleted, not_created,
                                                largest_total)
        if previous is not None:
            os.remove(previous.path)

    def check_last(self, server_args, groups, final_total):
        """Restores the last backup, serves it alone and checks it (see above); returns the
        problems found, and a line saying what was checked."""
        backup = self.last
        if backup is None:
            return [], "no backup was written whole"
        backend = backend_of(server_args)
        restored = os.path.join(self.root, "restored")
        argv = [self.concord, "restore", "--input", backup.path, "--data-dir", restored,
                "--backend", "wal" if backend in (None, "mem") else backend]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return [f"the last backup did not restore: {done.stderr.strip()}"], ""
        node = Member(self.concord, 1, f"1=127.0.0.1:{free_ports(1)[0]}", restored, groups,
                      without_backend(server_args))
        problems = []
        try:
            node.start()
            node.wait_listening()
            if not member_ready(node):
                return ["the restored node never became ready"], ""
            statuses = stale_statuses(node, sorted(backup.present))
            missing = sorted(c for c, code in statuses.items() if code != 200)
            # An id never written is among them: a node answering 200 to every read is caught
            # even when no delete was answered before the backup.
            gone = sorted(backup.deleted | backup.not_created | {NEVER_WRITTEN})
            back = sorted(c for c, code in stale_statuses(node, gone).items() if code != 404)
            if missing:
                problems.append(f"restored backup: {len(missing)} sessions created before it "
                                f"began are missing, e.g. {missing[:3]}")
            if back:
                problems.append(f"restored backup: {len(back)} sessions deleted (or never "
                                f"made) before it began are there, e.g. {back[:3]}")
            total = restored_total(node) if final_total is not None else None
            if final_total is not None and (total is None or not (
                    backup.largest_total <= total <= final_total)):
                problems.append(f"restored backup: counter {total}, outside "
                                f"{backup.largest_total}..{final_total}")
        finally:
            node.stop()
            shutil.rmtree(restored, ignore_errors=True)
        checked = (f"restored the last backup (through {backup.member}): "
                   f"{len(backup.present)} sessions present, "
                   f"{len(backup.deleted) + len(backup.not_created) + 1} absent checked")
        return problems, checked


def reason(stderr):
    """The gist of a failed `concord backup`: its last line, without ids that vary."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no message"
    status = re.search(r"HTTP (\d{3})", last)
    if status:
        return f"HTTP {status.group(1)}"
    for marker in ("connection refused", "timed out", "cut short", "reset"):
        if marker in last.lower():
            return marker
    return last[:80]


def backend_of(server_args):
    for flag, value in zip(server_args, server_args[1:]):
        if flag == "--backend":
            return value
    return None


def without_backend(server_args):
    """The flags without `--backend X`: a restored directory names its own."""
    kept, skip = [], False
    for arg in server_args:
        if skip:
            skip = False
        elif arg == "--backend":
            skip = True
        else:
            kept.append(arg)
    return kept


def restored_total(node):
    """The counter plugin's total on the restored node (0 if never incremented), or None if
    it could not be read."""
    code, body = call_raw(node.address, "GET", "/v1/plugins/counter/keys/counter"
                          "?consistency=stale")
    if code == 200 and len(body) == 8:
        return int.from_bytes(body, "little", signed=True)
    return 0 if code == 404 else None
