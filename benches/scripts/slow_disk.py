"""A slow disk for one process, for `cluster_chaos.py`: the process is moved into a block-I/O
cgroup whose writes to the disk under a directory are throttled to a few operations a second
(cgroup v1 `blkio.throttle.write_iops_device`), then moved back. Writes the process submits
itself — the WAL's and the state's syncs — wait their turn; each `fdatasync` then takes tens
to hundreds of milliseconds. Needs root and the v1 blkio controller.
"""

import os

BLKIO = "/sys/fs/cgroup/blkio"
GROUP = os.path.join(BLKIO, "concord-chaos-slow-disk")


class SlowDisk:
    def __init__(self, directory):
        """Prepares the cgroup for the disk `directory` is on; raises OSError (with the
        reason) where this machine cannot throttle it."""
        if os.geteuid() != 0:
            raise OSError("the slow-disk fault needs root (it writes to the blkio cgroup)")
        if not os.path.isdir(BLKIO):
            raise OSError(f"no cgroup v1 blkio controller at {BLKIO}")
        self.device = whole_disk(os.stat(directory).st_dev)
        os.makedirs(GROUP, exist_ok=True)

    def slow(self, pid, write_iops):
        """Throttles `pid`'s writes to `write_iops` operations a second."""
        write(os.path.join(GROUP, "blkio.throttle.write_iops_device"),
              f"{self.device} {write_iops}")
        write(os.path.join(GROUP, "cgroup.procs"), str(pid))

    def restore(self, pid):
        """Moves `pid` back to the root cgroup and lifts the group's limit; a process gone is
        no error. Moving the process alone would leave the writes it had queued under the
        limit trickling out at the slow rate (and a later `fdatasync` of the same pages, even
        from a restarted process, waiting for them): a disk that recovers drains its queue."""
        try:
            write(os.path.join(BLKIO, "cgroup.procs"), str(pid))
        except ProcessLookupError:
            pass
        write(os.path.join(GROUP, "blkio.throttle.write_iops_device"), f"{self.device} 0")

    def close(self):
        try:
            os.rmdir(GROUP)
        except OSError:
            pass  # A process still in it (it then ends with it) or already removed.


def whole_disk(device):
    """`major:minor` of the disk holding `device` (a partition's disk: throttles name disks)."""
    sysfs = f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"
    if os.path.exists(os.path.join(sysfs, "partition")):
        with open(os.path.join(sysfs, "..", "dev")) as parent:
            return parent.read().strip()
    if not os.path.exists(sysfs):
        raise OSError(f"{sysfs}: the directory is not on a block device")
    return f"{os.major(device)}:{os.minor(device)}"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
