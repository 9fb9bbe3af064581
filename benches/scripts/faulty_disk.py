"""Disks that fail on command, for `disk_errors.py` and `cluster_chaos.py`: `faulty_disk.c`,
built here with the machine's C compiler and loaded into a `concord` process with LD_PRELOAD,
answers EIO to the calls chosen, on the files under that member's data directory only — what a
process sees of a disk that fails. Each member attached gets a control file of its own.
"""

import os
import subprocess

# What fails: the bits of the control file's first byte that `faulty_disk.c` reads.
FAIL_WRITES, FAIL_SYNCS, FAIL_READS = 1, 2, 4
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faulty_disk.c")


class FaultyDisks:
    def __init__(self, directory):
        """Builds the library into `directory`; raises OSError (with the reason) where this
        machine cannot build it."""
        self.directory = directory
        self.library = os.path.join(directory, "faulty_disk.so")
        try:
            subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", self.library, SOURCE, "-ldl"],
                           check=True)
        except (OSError, subprocess.CalledProcessError) as error:
            raise OSError(f"cannot build faulty_disk.c with cc: {error}") from error

    def control_path(self, member):
        return os.path.join(self.directory, f"disk-{member.node}")

    def attach(self, member):
        """Makes `member`'s next starts load the library, its disk healthy for now."""
        path = self.control_path(member)
        with open(path, "wb") as control:
            control.write(bytes(16))
        member.env = {**os.environ, "LD_PRELOAD": self.library,
                      "CONCORD_FAULTY_DIR": member.data_dir, "CONCORD_FAULTY_CONTROL": path}

    def fail(self, member, bits, percent=100):
        """From now on `percent` of `member`'s calls of the kinds in `bits` fail (0: none)."""
        with open(self.control_path(member), "r+b") as control:
            control.write(bytes([bits, min(percent, 100)]))

    def errors_answered(self, member):
        with open(self.control_path(member), "rb") as control:
            return int.from_bytes(control.read()[8:16], "little")
