#!/usr/bin/env python3
"""A disk whose write-back fails, as the kernel handles it: one `concord` process with its data
directory on an ext4 file system that the script makes on a loop device, the loop device's
image on a tmpfs the script fills (run as root). Writes into the file system still succeed into
the page cache; the kernel's write-back of them to the full image fails, `fdatasync` reports the
error once, and the pages that failed stay in the cache marked clean: a later read, by any
process, returns what the disk does not hold, until the cache lets them go (a reboot, memory
pressure, an unmount). The script:

  1. writes creates until the image is full and the node stops on the failed sync (its log
     names the error);
  2. frees the image's space and starts the node again on the same kernel, the page cache
     untouched, and writes creates for a few seconds more (answered 201: acknowledged);
  3. kills the node (SIGKILL), unmounts and mounts the file system again (what a reboot does to
     its page cache) and starts the node once more: every create answered 201 must be there
     (a stale read of the node's own state), but see below for those answered while the image
     filled.

A node that reads the cache in step 2 takes bytes the disk lacks for durable and writes on top
of them; after step 3 the disk shows the hole (redb: "All roots are corrupted", the node does not
start). Concord syncs and drops the cached pages of its files when it opens, and reads the disk.

This test bed's kernel breaks a promise of its own, once, as the image fills: an `fdatasync`
returns success although the write-back of the block it waited for failed, and the error goes
to the next call. The script shows it first with a plain writer (records appended and synced
one by one until a sync fails, then all read back past the cache: `kernel_lost_synced_records`). So the
creates answered while the image fills ("failing") are counted and reported, not checked: one
of them may be the record the kernel lied about. Those answered before it and after the
restart must all be there.

Usage (release build first: cargo build --release -p concord-http; needs losetup, mkfs.ext4):
  sudo python3 benches/scripts/writeback_failure.py
  sudo python3 benches/scripts/writeback_failure.py --server-args '--backend redb'

Prints each step and a JSON line {"case": "writeback_failure", ...}; exits 1 if a check failed
(the file system is then left mounted and named).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time

from cluster_recovery import Member, free_ports, member_ready, stale_statuses
from disk_full import Written, writer

# The loop device's image: sparse, on the tmpfs; mkfs writes its metadata and journal in full
# (no lazy initialisation), so that only the data written later needs new space in the image.
IMAGE_MIB = 512


def run(*command):
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


class LoopDisk:
    """An ext4 file system on a loop device whose image lives on a tmpfs of `tmpfs_mib`."""

    def __init__(self, root, tmpfs_mib):
        self.backing = os.path.join(root, "backing")
        self.mount_point = os.path.join(root, "disk")
        os.makedirs(self.backing)
        os.makedirs(self.mount_point)
        run("mount", "-t", "tmpfs", "-o", f"size={tmpfs_mib}m", "tmpfs", self.backing)
        image = os.path.join(self.backing, "image")
        with open(image, "wb") as file:
            file.truncate(IMAGE_MIB * 1024 * 1024)
        self.device = subprocess.run(["losetup", "-f", "--show", image], check=True,
                                     capture_output=True, text=True).stdout.strip()
        run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.device)
        self.mount()
        self.filler = os.path.join(self.backing, "filler")

    def mount(self):
        run("mount", self.device, self.mount_point)

    def remount(self):
        """Unmounts and mounts again: the file system's page cache is gone, as after a
        reboot."""
        run("umount", self.mount_point)
        self.mount()

    def fill(self):
        """Fills the tmpfs to its last page: write-back of new data to the image fails from
        now on."""
        with open(self.filler, "wb", buffering=0) as filler:
            for chunk_bytes in (1 << 20, 4096):
                try:
                    while True:
                        filler.write(b"\0" * chunk_bytes)
                except OSError:
                    pass

    def free(self):
        if os.path.exists(self.filler):
            os.unlink(self.filler)

    def tear_down(self):
        subprocess.run(["umount", self.mount_point])
        subprocess.run(["losetup", "-d", self.device])
        # The loop device lets go of its image asynchronously.
        for _ in range(100):
            if subprocess.run(["umount", self.backing], stderr=subprocess.DEVNULL).returncode == 0:
                return
            time.sleep(0.1)


def kernel_lost_synced_records(root, tmpfs_mib):
    """On a test bed of its own: appends 300-byte records to a sparse file, each synced with
    `fdatasync`; fills the image; goes on until a sync fails. Returns how many records whose
    sync succeeded the disk does not hold (each read back past the page cache)."""
    disk = LoopDisk(root, tmpfs_mib)
    path = os.path.join(disk.mount_point, "records")
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    os.ftruncate(fd, 64 << 20)
    record_bytes, offset, synced = 300, 0, []
    try:
        for number in range(100_000):
            if number == 1000:
                disk.fill()
            record = bytes([1 + number % 250]) * record_bytes
            os.pwrite(fd, record, offset)
            try:
                os.fdatasync(fd)
            except OSError:
                break
            synced.append((offset, record))
            offset += record_bytes
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return sum(1 for at, record in synced if os.pread(fd, len(record), at) != record)
    finally:
        os.close(fd)
        disk.free()
        disk.tear_down()


def write_for(member, written, seconds, writers, prefix):
    """Creates through `member` from `writers` threads for `seconds` or until it exits."""
    stop = threading.Event()
    threads = [threading.Thread(target=writer, args=(i, [member], written, stop, prefix, None))
               for i in range(writers)]
    for t in threads:
        t.start()
    deadline = time.time() + seconds
    while time.time() < deadline and member.process.poll() is None:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()


def missing(member, written):
    """The creates answered 201 that a stale read on `member` does not find."""
    answered = sorted(written.present)
    statuses = stale_statuses(member, answered)
    return [c for c in answered if statuses.get(c) != 200]


def start(member, log_path):
    """Starts `member` with its log appended to `log_path`; `True` once it is ready."""
    member.stderr = open(log_path, "a")
    member.start()
    line = member.process.stdout.readline().strip()
    if "http://" not in line:
        member.process.wait()
        return False
    member.address = line.rsplit("http://", 1)[1]
    return member_ready(member)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--tmpfs-mib", type=int, default=160)
    parser.add_argument("--rewrite-secs", type=float, default=5.0)
    parser.add_argument("--server-args", default="",
                        help="more arguments for `concord serve`, e.g. '--backend redb'")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="concord-writeback-failure-")
    result = {"case": "writeback_failure", "server_args": args.server_args}
    result["kernel_lost_synced_records"] = kernel_lost_synced_records(
        os.path.join(root, "control"), args.tmpfs_mib)
    print(f"a plain writer: {result['kernel_lost_synced_records']} records whose fdatasync "
          "succeeded are not on the disk", flush=True)
    disk = LoopDisk(os.path.join(root, "node"), args.tmpfs_mib)
    port = free_ports(1)[0]
    member = Member(args.concord, 1, f"1=127.0.0.1:{port}", os.path.join(disk.mount_point, "1"),
                    args.groups, shlex.split(args.server_args))
    log_path = os.path.join(root, "node-1.log")
    written = Written()
    problems = []

    def check(when):
        """Reads back every create answered so far; returns the missing ones by phase."""
        lost = missing(member, written)
        by_phase = {phase: sum(1 for c in lost if c.startswith(phase + "-"))
                    for phase in ("before", "failing", "after")}
        print(f"{when}: {len(lost)} of {len(written.present)} answered creates missing "
              f"{by_phase}", flush=True)
        checked = [c for c in lost if not c.startswith("failing-")]
        if checked:
            problems.append(f"{when}: {len(checked)} answered creates missing, "
                            f"e.g. {checked[:3]}")
        return by_phase

    try:
        if not start(member, log_path):
            raise SystemExit("node 1 did not start")
        write_for(member, written, 2, args.writers, "before")
        result["answered_before"] = len(written.present)
        disk.fill()
        print(f"{len(written.present)} creates answered; the image is full", flush=True)
        write_for(member, written, 60, args.writers, "failing")
        code = member.process.poll()
        if code is None:
            member.kill()
        with open(log_path) as log:
            text = log.read()
        named = "No space left on device" in text or "Input/output error" in text
        print(f"node 1 exited with {code}; its log names the failed write-back: {named}",
              flush=True)
        if code in (None, 0) or not named:
            problems.append(f"node 1 exited with {code}, the error named: {named}")
        result["answered_while_filling"] = len(written.present) - result["answered_before"]

        disk.free()
        if not start(member, log_path):
            problems.append("node 1 did not start again on the same kernel")
        else:
            result["missing_at_the_restart"] = check("started again on the same kernel")
            before = len(written.present)
            write_for(member, written, args.rewrite_secs, args.writers, "after")
            result["answered_after"] = len(written.present) - before
            print(f"{result['answered_after']} more creates answered; now SIGKILL and a remount",
                  flush=True)
            member.kill()
        disk.remount()
        if not start(member, log_path):
            problems.append("node 1 did not start after the remount")
        else:
            result["missing_after_the_remount"] = check("after the remount")
            member.stop()
    finally:
        if member.process and member.process.poll() is None:
            member.kill()
    result["problems"] = problems
    print(json.dumps(result), flush=True)
    if problems:
        print(f"FAILED: {problems}; the file system stays mounted at {disk.mount_point}, "
              f"node 1's log at {log_path}", flush=True)
        sys.exit(1)
    disk.tear_down()
    print("passed", flush=True)


if __name__ == "__main__":
    main()
