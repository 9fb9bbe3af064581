#!/usr/bin/env python3
"""Three `concord` processes on loopback, writes through every member, and members made to fail
one fault at a time, for as long as asked: does the cluster lose or bring back anything it
answered?

Writers create sessions (each id once), delete some of those they created, and read some back
with a linearizable or a lease read, each request through a random member, for
`--duration-secs`. Every few seconds one member fails (or two, or all three), in one of fourteen
ways, chosen at random:

  kill     SIGKILL, down 0.5-3 s, started again on its data
  wipe     SIGKILL, its data directory removed, started again empty (`--initial-cluster-state
           existing`): it comes back through snapshots
  wipe-new the same, started again with the flags of its first start (`new` for the three
           first members, as an operator who lost a disk and forgot the flag would): it must
           vote for nobody until it caught up, once asked by a candidate whose log has entries
  pause    SIGSTOP for 1-4 s, then SIGCONT: a member that stalls while writers still send to
           it (its leaderships are taken over meanwhile; it must step down when it wakes, and
           what waited in its sockets is served then)
  restart  SIGTERM (leaderships handed over first), started again on its data
  retick   SIGKILL, started again on its data within 1 s with other ticks (`--raft-tick-ms`
           20, 50, 100 or 200, kept until its next retick): the members' election timeouts
           then differ up to tenfold, and a member whose ticks got shorter must hold its vote
           for the longer quiet it said before (its `VOTE_QUIET`), which a leader's lease may
           still count on
  kill-two SIGKILL of two members, started again on their data: no quorum meanwhile (the
           survivor commits nothing, so it must acknowledge nothing new)
  kill-all SIGKILL of all three, started again on their data: every acknowledged write must
           have been on disk
  replace  the member replaced, as an operator replaces a machine: a new member (the next
           node id, a new raft port) starts empty, is added as a learner through another
           member (it catches up through snapshots) and promoted to voter, and the old one is
           removed through another member — either after that, while it runs (then stopped
           with SIGTERM or SIGKILL), or before, killed first (a machine lost)
  partition links cut for 1-5 s, then healed: the member cut off from the others both ways,
           cut off from one other member both ways (the third still talks to both), or unable
           to send to one other member (it still hears it); the connections cut are closed,
           or kept open and silent (what they carried is delivered late, on healing); members
           talk through a proxy in front of each raft port (`partition_proxy.py`) whenever
           this fault may be chosen
  delay    links slowed for 2-6 s, then healed: every byte on them, either way, arrives
           50-1500 ms after it was sent (order kept, nothing lost), either on every link of
           the member or on its link with one other member; past the election timeout (1 s)
           heartbeats arrive too late to hold a leadership or a lease, and elections run on
           messages already stale (through the same proxy)
  jitter   links made unsteady for 2-6 s, then healed: each read on them waits 0-100 ms plus
           its own random share of 0.2-1.5 s, and never overtakes the read before it (order
           kept, nothing lost), on every link of the member or on one: some heartbeats arrive
           in time and others past the election timeout, a late one holding back those behind
           it, as one TCP stream over a path whose latency swings (through the same proxy)
           (partition, delay and jitter are left out with `--peer-tls-*` in --server-args:
           the proxy learns who dials from the hello, which TLS encrypts; `--relay` still
           sends every peer byte through it, a TCP relay on the path that cuts nothing)
  slow-disk the member's writes throttled to 5-50 a second for 2-6 s (`slow_disk.py`: a blkio
           cgroup; root only, left out of the default set otherwise): each sync of its log and
           state takes tens to hundreds of milliseconds
  disk-errors the member's disk fails (`faulty_disk.py`: a library every member loads, built
           with cc; left out of the default set where there is none): its writes and syncs, its
           syncs alone, or one in ten of its writes, syncs and reads answer EIO until it stops
           by itself (it must exit with 1, as on any storage error, not panic) or for 10 s; the
           disk is healed, and a member that stopped is started again on its data

With `--overlap P`, a fault is joined, with probability P, by a second one on another member,
begun 0-2 s after the first: kill, pause, restart, wipe or wipe-new, never a wipe beside a
wipe (two of three members without their data is more than raft survives). Outages compound:
a member wiped while another is down must wait for it before it can vote, a member paused
while another restarts holds back the restart's readiness. Only faults of one member take a
second (not replace, kill-two, kill-all). The second fault draws from its own random stream,
seeded from the run's, so a seed still gives the same faults.

Every member is started again, wiped or not, with the member list it was first started with
(`--initial-cluster`), as an operator's unchanged configuration would: a member added since is
missing from it, a member removed since is still in it — until it names no other member still
in the cluster; then it names the members of the day.

The next fault waits until every member the last one stopped is ready again. At the end every
member is up; once every group has applied the same index everywhere, the script checks,
through each member with a stale read (its own state):
  - every create answered 201 is there, unless a delete of it was answered 204 or left
    without an answer;
  - every delete answered 204 stays deleted;
  - every create answered 503 with a problem type that promises it did not apply (overloaded,
    not-leader, retry: safe to retry as is) is not there;
  - each group's digest is the same on every member.
During the run, a linearizable or lease read that answered 404 for a session whose create was
answered and that was never deleted (or 200 for one whose delete was answered), and a delete of
such a session that answered 404, are counted too. Half the reads ask for the writer's newest
create or the newest delete answered, and about a third of the creates and deletes answered
are read back at once through another member: where a stale read would show first. A tenth of
the requests are batches of 2-20 creates (`POST /v1/sessions/batch`); each create answered 201
in one is checked as if answered alone.

The members also serve the counter plugin (`fixtures/plugins/counter.wasm`, `--counter-plugin`):
a tenth of the requests add 1 to its one counter (the key `counter`), alone or 2-20 in a batch,
each answered with the total it made. At the end every member must hold the same total, no
total may have been answered twice, the total may not be under the largest answered nor over
the increments that may have applied (none applied twice, and none applied that a 503 said was
safe to retry: problem types overloaded, not-leader, retry), and an increment answered before
another was sent must have made the smaller total (real-time order).

Every `--backup-every-secs` (30) `concord backup` runs through a random live member while the
faults go on (`chaos_backups.py`); at the end the last backup written whole is restored, served
alone and checked against what the writers had been told before it began: every session
created and not deleted since is there, every delete answered and every create answered as
safe to retry is not, and the counter is between the largest total answered then and the final
one. A backup that fails while members fail is counted, not a problem.

Groups left idle for a moment fall asleep (`--sleep-after-ticks`): every 5 s the script counts
the groups one live member has asleep, and prints the least, median and most it saw. With the
default 8 groups they stay busy; with many (`--groups 1024`) each gets a request about once a
second, so they fall asleep and wake all through the faults.

Usage (release build first: cargo build --release -p concord-http):
  python3 benches/scripts/cluster_chaos.py --duration-secs 600 --seed 7

Prints each fault, a summary, and a JSON line {"case": "cluster_chaos", ...}; exits 1 if any
check failed (the members' data directories are then kept and named).
"""

import argparse
import base64
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from chaos_backups import Backups
from cluster_recovery import (Member, call, call_raw, free_ports, group_digest, member_ready,
                              stale_statuses, status, stop_all)
from faulty_disk import FAIL_READS, FAIL_SYNCS, FAIL_WRITES, FaultyDisks
from partition_proxy import PartitionProxy
from slow_disk import SlowDisk

FAULTS = ("kill", "wipe", "pause", "restart", "retick", "kill-two", "kill-all", "replace",
          "partition", "delay", "jitter", "slow-disk", "disk-errors", "wipe-new")
# The faults `--overlap` may add beside another, on a second member.
OVERLAPPING = ("kill", "pause", "restart", "wipe", "wipe-new")
# The faults that stop more than their member (or add one): never joined by a second.
MANY_MEMBERS = ("kill-two", "kill-all", "replace")
WIPES = ("wipe", "wipe-new")
# The faults that need members to talk through the proxy.
PROXIED = ("partition", "delay", "jitter")
COUNTER_PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "fixtures", "plugins", "counter.wasm")
# The ticks a `retick` chooses from, in milliseconds; `concord serve` ticks every 100 by default.
RETICK_MS = (20, 50, 100, 200)
DEFAULT_TICK_MS = 100
# The counter plugin's one key: every increment is routed to its group.
COUNTER_KEY = "counter"
# The problem types of a 5xx answer that promise the write did not apply (safe to retry).
NOT_APPLIED = ("urn:concord:problem:overloaded", "urn:concord:problem:not-leader",
               "urn:concord:problem:retry")


class Ledger:
    """What the writers were told, shared between them (each id belongs to one writer)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.present = set()  # creates answered 201, no delete sent since
        self.deleted = set()  # deletes answered 204
        self.deleted_in_order = []  # the same, to pick from
        self.unknown = set()  # a delete sent without an answer: either outcome is right
        self.not_created = set()  # creates answered 5xx with the promise they did not apply
        self.counts = {}
        self.contradictions = []  # answers during the run that contradict earlier ones
        self.increments = []  # (monotonic time sent, time answered, total) of increments answered
        self.increments_unknown = 0  # increments that may have applied, unanswered or 5xx
        self.writers_stopped = []  # writers that stopped before the end, and why

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1


def writer(index, cluster, ledger, stop, seed, counter):
    """Sends writes and reads until `stop`; a writer stopped by anything but a request
    without an answer is a problem of the run (its load and its checks would be missing)."""
    try:
        write_until(index, cluster, ledger, stop, seed, counter)
    except Exception as error:  # whatever it was, it is reported
        with ledger.lock:
            ledger.writers_stopped.append(f"writer {index} stopped: {error!r}")


def write_until(index, cluster, ledger, stop, seed, counter):
    chooser = random.Random(seed * 1000 + index)
    mine = []  # this writer's present sessions
    n = 0
    while not stop.is_set():
        live = cluster.live()
        if not live:
            time.sleep(0.05)  # every member is down: wait for one
            continue
        member = chooser.choice(live)
        roll = chooser.random()
        try:
            if roll < 0.15 and mine:
                client_id = mine.pop(chooser.randrange(len(mine)))
                with ledger.lock:
                    ledger.present.discard(client_id)
                    ledger.unknown.add(client_id)
                try:
                    code, _ = call(member, "DELETE", f"/v1/sessions/{client_id}", timeout=10)
                except ConnectionRefusedError:
                    # Refused at the connect: the delete never reached a member.
                    mine.append(client_id)
                    with ledger.lock:
                        ledger.unknown.discard(client_id)
                        ledger.present.add(client_id)
                    raise
                ledger.count(f"delete {code}")
                if code == 204:
                    with ledger.lock:
                        ledger.unknown.discard(client_id)
                        ledger.deleted.add(client_id)
                        ledger.deleted_in_order.append(client_id)
                    read_elsewhere(member, client_id, 404, cluster, ledger, chooser)
                elif code == 404:
                    # Sent once, for a session whose create was answered: it was lost.
                    with ledger.lock:
                        ledger.contradictions.append(
                            f"delete of answered create {client_id} through {member}: 404")
            elif roll < 0.30 and (mine or ledger.deleted_in_order):
                # Half the reads ask for the newest answer (a stale read shows there first).
                newest = chooser.random() < 0.5
                with ledger.lock:
                    done = ledger.deleted_in_order
                    deleted = (done[-1] if newest else chooser.choice(done)) if done else None
                if mine and (deleted is None or chooser.random() < 0.8):
                    client_id, expect = (mine[-1] if newest else chooser.choice(mine)), 200
                else:
                    client_id, expect = deleted, 404
                read_back(member, client_id, expect, ledger, chooser)
            elif counter and roll < 0.40:
                increment(member, ledger, chooser)
            elif roll < (0.50 if counter else 0.40):
                # A batch of new sessions: each create answered 201 in it counts as one
                # answered alone.
                ids = []
                for _ in range(chooser.randint(2, 20)):
                    n += 1
                    ids.append(f"chaos-{index}-{n}")
                body = json.dumps({"operations": [
                    {"op": "create", "client_id": client_id,
                     "session": {"broker_id": "chaos", "connection_id": n}}
                    for client_id in ids]})
                code, text = call(member, "POST", "/v1/sessions/batch", body, timeout=10)
                ledger.count(f"batch {code}")
                if said_not_applied(code, problem_type(text)):
                    with ledger.lock:
                        ledger.not_created.update(ids)
                if code == 200:
                    results = json.loads(text)["results"]
                    for client_id, result in zip(ids, results):
                        ledger.count(f"batch create {result['status']}")
                        if result["status"] == 201:
                            mine.append(client_id)
                            with ledger.lock:
                                ledger.present.add(client_id)
                        elif said_not_applied(result["status"],
                                              (result.get("problem") or {}).get("type")):
                            with ledger.lock:
                                ledger.not_created.add(client_id)
                    if results and results[-1]["status"] == 201:
                        read_elsewhere(member, ids[-1], 200, cluster, ledger, chooser)
            else:
                n += 1
                client_id = f"chaos-{index}-{n}"
                body = json.dumps({"client_id": client_id, "broker_id": "chaos",
                                   "connection_id": n})
                code, text = call(member, "POST", "/v1/sessions", body, timeout=10)
                ledger.count(f"create {code}")
                if said_not_applied(code, problem_type(text)):
                    with ledger.lock:
                        ledger.not_created.add(client_id)
                if code == 201:
                    mine.append(client_id)
                    with ledger.lock:
                        ledger.present.add(client_id)
                    read_elsewhere(member, client_id, 200, cluster, ledger, chooser)
        except (OSError, http.client.HTTPException) as error:
            # Refused, reset, timed out or cut off mid-answer: a member going down. The
            # request's outcome is unknown; a delete stays in `unknown`, a create is not
            # counted as answered.
            ledger.count(f"no answer ({type(error).__name__})")
            time.sleep(0.01)


def said_not_applied(code, problem):
    """Whether an answer of status `code` and problem type `problem` promises that the write
    did not apply (a 5xx of a type in NOT_APPLIED)."""
    return code >= 500 and problem in NOT_APPLIED


def problem_type(body):
    """The `type` of a problem+json body, or None."""
    try:
        return json.loads(body).get("type")
    except (ValueError, AttributeError):
        return None


def increment(member, ledger, chooser):
    """Adds 1 to the counter plugin's counter through `member`, alone or 2-20 times in a batch,
    and records the total each increment answered 200 made. An increment answered 4xx, or 5xx
    with a problem type that promises it did not apply (NOT_APPLIED), was not applied; one
    answered otherwise, or not answered, may have been."""
    count = 1 if chooser.random() < 0.5 else chooser.randint(2, 20)
    sent = time.monotonic()
    try:
        if count == 1:
            code, answer = call_raw(member, "POST",
                                    f"/v1/plugins/counter/commands?key={COUNTER_KEY}", b"",
                                    "application/octet-stream", timeout=10)
            outcomes = [(code, answer, None if code == 200 else problem_type(answer))]
        else:
            body = json.dumps({"commands": [{"key": COUNTER_KEY, "command_base64": ""}] * count})
            code, text = call(member, "POST", "/v1/plugins/counter/commands/batch", body,
                              timeout=10)
            outcomes = ([(r["status"], base64.b64decode(r.get("result_base64", "")),
                          (r.get("problem") or {}).get("type"))
                         for r in json.loads(text)["results"]] if code == 200
                        else [(code, b"", problem_type(text))] * count)
    except ConnectionRefusedError:
        raise  # refused at the connect: nothing was sent
    except (OSError, http.client.HTTPException):
        with ledger.lock:
            ledger.increments_unknown += count
        raise
    answered = time.monotonic()
    with ledger.lock:
        for code, result, problem in outcomes:
            said = f"increment {code}" + (f" {problem.rsplit(':', 1)[-1]}" if problem else "")
            ledger.counts[said] = ledger.counts.get(said, 0) + 1
            if code == 200 and len(result) == 8:
                total = int.from_bytes(result, "little", signed=True)
                ledger.increments.append((sent, answered, total))
            elif code == 200:
                ledger.contradictions.append(f"increment through {member}: result {result!r}")
            elif code >= 500 and not said_not_applied(code, problem):
                ledger.increments_unknown += 1


def read_back(member, client_id, expect, ledger, chooser):
    """A linearizable or lease read of `client_id` through `member`; an answer other than
    `expect` (200 or 404) is a contradiction."""
    consistency = chooser.choice(("linearizable", "lease"))
    code, _ = call(member, "GET", f"/v1/sessions/{client_id}?consistency={consistency}",
                   timeout=10)
    ledger.count(f"read {code}")
    if code in (200, 404) and code != expect:
        with ledger.lock:
            ledger.contradictions.append(
                f"{consistency} read of {client_id} through {member}: {code}")


def read_elsewhere(member, client_id, expect, cluster, ledger, chooser):
    """Now and then, reads what was just answered through `member` back through another
    member: a deposed leader that still served reads would answer from before it."""
    others = [m for m in cluster.live() if m != member]
    if others and chooser.random() < 0.3:
        read_back(chooser.choice(others), client_id, expect, ledger, chooser)


class Cluster:
    def __init__(self, members, raft_addrs, proxy, slow_disk, faulty_disks, server_args):
        self.members = members  # the members of the day, in the order faults pick them from
        self.raft_addrs = dict(raft_addrs)  # node id -> raft address, of the members of the day
        self.proxy = proxy  # the members' partition proxy, or None
        self.slow_disk = slow_disk  # a SlowDisk, or None
        self.faulty_disks = faulty_disks  # FaultyDisks every member is attached to, or None
        self.server_args = server_args  # `concord serve` flags of every member
        self.note = None  # what the last fault did, besides its name
        self.started = list(members)  # every member ever started, to stop at the end
        self.next_node = max(self.raft_addrs) + 1
        self.down = set()  # nodes not to send to
        self.lock = threading.Lock()

    def live(self):
        with self.lock:
            addresses = [m.address for m in self.members if m.node not in self.down]
        return addresses

    def set_down(self, member, down):
        with self.lock:
            (self.down.add if down else self.down.discard)(member.node)

    def initial_cluster(self):
        """`--initial-cluster` naming the members of the day."""
        return ",".join(f"{node}={addr}" for node, addr in sorted(self.raft_addrs.items()))

    def join(self, member, raft_addr):
        with self.lock:
            self.members = self.members + [member]
            self.raft_addrs[member.node] = raft_addr

    def retire(self, member):
        """Forgets a member that was removed and stopped, and deletes its data."""
        shutil.rmtree(member.data_dir, ignore_errors=True)
        with self.lock:
            self.members = [m for m in self.members if m is not member]
            del self.raft_addrs[member.node]
            self.down.discard(member.node)
        for m in self.members:
            named = {int(entry.split("=")[0]) for entry in m.members.split(",")}
            if not (named - {m.node}) & set(self.raft_addrs):
                # It must name one member still there to find the others (docs/OPERATIONS.md).
                m.members = self.initial_cluster()


SLEEP_SAMPLE_SECS = 5


def count_sleeping(cluster, stop, counts):
    """Every SLEEP_SAMPLE_SECS, how many groups a live member (a random one) has asleep
    (`asleep` in its /v1/status): whether the run had groups falling asleep and waking under
    its faults, or none (every group busy)."""
    chooser = random.Random(0)
    while not stop.wait(SLEEP_SAMPLE_SECS):
        live = cluster.live()
        if not live:
            continue
        try:
            code, body = call(chooser.choice(live), "GET", "/v1/status", timeout=3)
            if code == 200:
                counts.append(sum(1 for group in json.loads(body)["groups"] if group["asleep"]))
        except (OSError, ValueError, http.client.HTTPException):
            pass  # a member going down, paused, or not up yet


def raft_address(node, proxy):
    """A free port for member `node` to listen for raft on, and where the others dial it:
    that port, or its proxy's if `proxy`; returns the address dialled and the flags that make
    the member listen on the port."""
    port = free_ports(1)[0]
    if proxy is None:
        return f"127.0.0.1:{port}", []
    return proxy.add(node, port), ["--raft-addr", f"127.0.0.1:{port}"]


def start_cluster(members):
    """Starts every member, then waits until each listens and is ready."""
    for m in members:
        m.start()
    for m in members:
        m.wait_listening()
    if not all(member_ready(m) for m in members):
        raise SystemExit("the cluster never became ready")


def victims_of(fault, member, members):
    """The members a fault chosen at `member` stops: it, the next one too, or all three."""
    if fault == "kill-all":
        return list(members)
    if fault == "kill-two":
        return [member, members[(members.index(member) + 1) % len(members)]]
    return [member]


def admin(member, method, path, body=None, timeout=180):
    """A membership call through `member`, asked again while it answers 503 (no leader yet),
    504 (not every group took it within its time) or 409 for a change still under way;
    returns the last answer's code and body."""
    deadline = time.time() + timeout
    while True:
        try:
            code, answer = call(member.address, method, path, body, timeout=60)
        except OSError as error:
            code, answer = 0, repr(error)
        again = code in (0, 503, 504) or (code == 409 and "under way" in answer)
        if not again or time.time() > deadline:
            return code, answer
        time.sleep(0.2)


def replace(member, cluster, chooser, root):
    """Replaces `member` with a new member (`replace` above), in one of two orders chosen at
    random: the new member added and promoted first (a machine retired while it runs), or
    `member` killed first and removed while down (a machine lost), then the new one added;
    returns a problem, or None."""
    others = [m for m in cluster.members if m is not member]
    lost_first = chooser.random() < 0.5
    if lost_first:
        cluster.set_down(member, True)
        member.kill()
        problem = remove(member, others, chooser)
        if problem:
            return problem
        cluster.retire(member)
    node = cluster.next_node
    cluster.next_node += 1
    raft_addr, listen = raft_address(node, cluster.proxy)
    newcomer = Member(member.binary, node, f"{cluster.initial_cluster()},{node}={raft_addr}",
                      os.path.join(root, str(node)), member.groups, cluster.server_args + listen)
    cluster.started.append(newcomer)
    if cluster.faulty_disks:
        cluster.faulty_disks.attach(newcomer)
    newcomer.start("existing")
    newcomer.wait_listening()
    body = json.dumps({"node_id": node, "raft_addr": raft_addr})
    code, answer = admin(chooser.choice(others), "POST", "/v1/cluster/members", body)
    if code != 200:
        return f"adding node {node}: {code} {answer}"
    if not member_ready(newcomer):
        return f"node {node}, added as a learner, not ready within 120 s (or exited)"
    code, answer = admin(chooser.choice(others), "POST", f"/v1/cluster/members/{node}/promote")
    if code != 200:
        return f"promoting node {node}: {code} {answer}"
    cluster.join(newcomer, raft_addr)
    if lost_first:
        return None
    cluster.set_down(member, True)
    problem = remove(member, others + [newcomer], chooser)
    member.kill() if chooser.random() < 0.5 else member.stop()
    if not problem:
        cluster.retire(member)
    return problem


def remove(member, others, chooser):
    """Removes `member` from the cluster through one of `others`; returns a problem, or None."""
    code, answer = admin(chooser.choice(others), "DELETE", f"/v1/cluster/members/{member.node}")
    return f"removing node {member.node}: {code} {answer}" if code != 200 else None


def partition(member, cluster, chooser):
    """Cuts links around `member` for 1-5 s, then heals them (`partition` above)."""
    proxy = cluster.proxy
    other = chooser.choice([m for m in cluster.members if m is not member])
    kind = chooser.choice(("isolated", "apart", "one way"))
    silent = chooser.random() < 0.5
    if kind == "isolated":
        for m in cluster.members:
            if m is not member:
                proxy.cut_link(member.node, m.node, silent)
                proxy.cut_link(m.node, member.node, silent)
        cluster.note = f"node {member.node} cut off from the others"
    elif kind == "apart":
        proxy.cut_link(member.node, other.node, silent)
        proxy.cut_link(other.node, member.node, silent)
        cluster.note = f"nodes {member.node} and {other.node} cut apart"
    else:
        proxy.cut_link(member.node, other.node, silent)
        cluster.note = f"node {member.node} cannot send to node {other.node}"
    seconds = chooser.uniform(1.0, 5.0)
    time.sleep(seconds)
    proxy.heal()
    cluster.note += f" for {seconds:.1f} s ({'silent' if silent else 'closed'})"


def delay(member, cluster, chooser, jitter):
    """Slows links around `member` for 2-6 s, steadily or with `jitter`, then heals them
    (`delay` and `jitter` above)."""
    proxy = cluster.proxy
    if jitter:
        seconds_late, jitter_seconds = chooser.uniform(0.0, 0.1), chooser.uniform(0.2, 1.5)
    else:
        seconds_late, jitter_seconds = chooser.uniform(0.05, 1.5), 0.0
    others = [m for m in cluster.members if m is not member]
    if chooser.random() < 0.5:
        slowed = others
        cluster.note = f"node {member.node}'s links"
    else:
        slowed = [chooser.choice(others)]
        cluster.note = f"the link of nodes {member.node} and {slowed[0].node}"
    for other in slowed:
        proxy.delay_link(member.node, other.node, seconds_late, jitter_seconds)
        proxy.delay_link(other.node, member.node, seconds_late, jitter_seconds)
    seconds = chooser.uniform(2.0, 6.0)
    time.sleep(seconds)
    proxy.heal()
    late = f"{seconds_late * 1000:.0f}"
    if jitter:
        late += f"-{(seconds_late + jitter_seconds) * 1000:.0f}"
    cluster.note += f" {late} ms late for {seconds:.1f} s"


def slow_disk(member, cluster, chooser):
    """Throttles `member`'s writes for 2-6 s, then lifts the throttle (`slow-disk` above)."""
    write_iops = chooser.choice((5, 20, 50))
    seconds = chooser.uniform(2.0, 6.0)
    pid = member.process.pid
    cluster.slow_disk.slow(pid, write_iops)
    try:
        time.sleep(seconds)
    finally:
        cluster.slow_disk.restore(pid)
    cluster.note = f"{write_iops} writes a second for {seconds:.1f} s"


def disk_errors(member, cluster, chooser):
    """Fails `member`'s disk until it stops by itself or for 10 s, heals it, and starts the
    member again if it stopped (`disk-errors` above); returns a problem, or None."""
    kind, bits, percent = chooser.choice((
        ("writes and syncs", FAIL_WRITES | FAIL_SYNCS, 100),
        ("syncs", FAIL_SYNCS, 100),
        ("1 in 10 writes, syncs and reads", FAIL_WRITES | FAIL_SYNCS | FAIL_READS, 10)))
    disks = cluster.faulty_disks
    errors_before = disks.errors_answered(member)
    disks.fail(member, bits, percent)
    try:
        code = member.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        code = None
    disks.fail(member, 0)
    failed = disks.errors_answered(member) - errors_before
    if code is None:
        cluster.note = f"{kind} failing: {failed} calls failed, went on for 10 s"
        if failed and percent == 100:
            # Every write or sync failed: going on would take what did not reach the disk
            # for durable.
            return f"node {member.node} went on after {failed} failed calls ({kind})"
        return None
    cluster.set_down(member, True)
    cluster.note = f"{kind} failing: {failed} calls failed, exited with {code}"
    if code != 1:
        return f"node {member.node} exited with {code} on a failing disk (not 1)"
    time.sleep(chooser.uniform(0.5, 2.0))
    member.start("new")
    member.wait_listening()
    problem = ready_again(member, cluster, "disk-errors")
    cluster.note += ", ready again" if problem is None else ""
    return problem


def tick_ms_of(server_args):
    """The `--raft-tick-ms` the flags give (the last), or the default."""
    given = [server_args[i + 1] for i, flag in enumerate(server_args[:-1])
             if flag == "--raft-tick-ms"]
    return int(given[-1]) if given else DEFAULT_TICK_MS


def retick(member, cluster, chooser):
    """Kills `member` and starts it again on its data with other ticks; returns a problem, or
    None once it is ready again."""
    before = tick_ms_of(member.server_args)
    after = chooser.choice([ms for ms in RETICK_MS if ms != before])

    def change_ticks():
        flags = member.server_args
        kept = [flag for i, flag in enumerate(flags)
                if flag != "--raft-tick-ms" and (i == 0 or flags[i - 1] != "--raft-tick-ms")]
        member.server_args = kept + ["--raft-tick-ms", str(after)]

    started = time.time()
    problem = down_and_back(member, cluster, "retick", chooser.uniform(0.0, 1.0),
                            while_down=change_ticks)
    if problem is None:
        cluster.note = f"ticks {before} -> {after} ms, back {time.time() - started:.1f} s after the kill"
    return problem


def down_and_back(member, cluster, fault, down_secs, while_down=None):
    """Stops `member` (`restart`: gracefully; otherwise SIGKILL), runs `while_down`, waits
    `down_secs` and starts it again; returns a problem, or None once it is ready again."""
    cluster.set_down(member, True)
    if fault == "restart":
        member.stop()
    else:
        member.kill()
    if while_down is not None:
        while_down()
    time.sleep(down_secs)
    member.start("existing" if fault == "wipe" else first_state(member) if fault == "wipe-new"
                 else "new")
    member.wait_listening()
    return ready_again(member, cluster, fault)


def first_state(member):
    """The `--initial-cluster-state` `member` was first started with: `new` for the three
    members the cluster began with, `existing` for those added since (`replace`)."""
    return "new" if member.node in (1, 2, 3) else "existing"


def ready_again(member, cluster, fault):
    """Waits for `member` to say it is ready and counts it up again; returns a problem, or None."""
    ready = member_ready(member)
    cluster.set_down(member, False)
    if ready:
        return None
    code = member.process.poll()
    if code is not None:
        return f"node {member.node} exited with {code} after {fault}"
    return f"node {member.node} not ready within 120 s after {fault}"


def inject(fault, member, cluster, chooser, root):
    """Makes `member` fail (with `kill-two` and `kill-all`, more members: `victims_of`; with
    `replace`, a new member takes its place); returns a problem, or None once every member it
    stopped is ready again."""
    if fault == "replace":
        return replace(member, cluster, chooser, root)
    if fault == "retick":
        return retick(member, cluster, chooser)
    if fault == "partition":
        partition(member, cluster, chooser)
        return None
    if fault in ("delay", "jitter"):
        delay(member, cluster, chooser, jitter=fault == "jitter")
        return None
    if fault == "slow-disk":
        slow_disk(member, cluster, chooser)
        return None
    if fault == "disk-errors":
        return disk_errors(member, cluster, chooser)
    if fault in ("kill-two", "kill-all"):
        victims = victims_of(fault, member, cluster.members)
        for victim in victims:
            cluster.set_down(victim, True)
            victim.kill()
        time.sleep(chooser.uniform(0.5, 3.0))
        for victim in victims:
            victim.start()
        for victim in victims:
            victim.wait_listening()
        ready = all(member_ready(victim) for victim in victims)
        for victim in victims:
            cluster.set_down(victim, False)
        return None if ready else f"a member not ready within 120 s (or exited) after {fault}"
    if fault == "pause":
        # Writers keep sending to it, as clients that do not know would: what they send waits
        # in its sockets and is served when it wakes, a deposed leader by then.
        member.process.send_signal(signal.SIGSTOP)
        time.sleep(chooser.uniform(1.0, 4.0))
        member.process.send_signal(signal.SIGCONT)
        return ready_again(member, cluster, fault)
    wiped = fault in WIPES
    wipe = (lambda: shutil.rmtree(member.data_dir)) if wiped else None
    return down_and_back(member, cluster, fault, chooser.uniform(0.5, 3.0), while_down=wipe)


def second_fault(fault, victim, cluster, chooser, faults_chosen, overlap):
    """The fault to add beside `fault` at `victim` (`--overlap` above): (fault, member, its
    own random stream), or None. Draws from `chooser` only when `overlap` is on, so that runs
    without it choose what they always did."""
    if overlap <= 0 or fault in MANY_MEMBERS:
        return None
    joins = chooser.random() < overlap
    seed = chooser.random()
    allowed = [f for f in OVERLAPPING
               if f in faults_chosen and not (f in WIPES and fault in WIPES)]
    others = [m for m in cluster.members if m is not victim]
    if not joins or not allowed or not others:
        return None
    own = random.Random(seed)
    return own.choice(allowed), own.choice(others), own


def run_second(second, cluster, root, outcome):
    """Injects the second fault after 0-2 s (`--overlap`); leaves (problem, seconds taken) in
    `outcome`."""
    fault, member, own = second
    time.sleep(own.uniform(0.0, 2.0))
    began = time.time()
    problem = inject(fault, member, cluster, own, root)
    outcome.append((problem, time.time() - began))


def converged(members, timeout=180):
    """Waits until every group has one applied index on every member, the same over two looks."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        views = [status(m.address) for m in members]
        if all(views):
            applied = [{g["group"]: g["applied_index"] for g in v["groups"]} for v in views]
            if all(a == applied[0] for a in applied) and applied[0] == last:
                return True
            last = applied[0] if all(a == applied[0] for a in applied) else None
        time.sleep(0.5)
    return False


def check(members, ledger):
    problems = []
    for member in members:
        for client_id, code in stale_statuses(member, sorted(ledger.present)).items():
            if code != 200:
                problems.append(f"node {member.node}: answered create {client_id} reads {code}")
        for client_id, code in stale_statuses(member, sorted(ledger.deleted)).items():
            if code != 404:
                problems.append(f"node {member.node}: answered delete {client_id} reads {code}")
        for client_id, code in stale_statuses(member, sorted(ledger.not_created)).items():
            if code != 404:
                problems.append(f"node {member.node}: create {client_id} answered as safe to "
                                f"retry reads {code}")
    groups = [g["group"] for g in status(members[0].address)["groups"]]
    for group in groups:
        digests = settled_digests(members, group)
        if len({d for d in digests.values()}) != 1:
            problems.append(f"group {group}: digests differ: {digests}")
    return problems


def settled_digests(members, group, timeout=30):
    """`group`'s (applied index, digest) on every member, read again while the members stand
    at different applied indexes (for up to `timeout` s): a group can take an entry after the
    members converged (a leadership moved by the balance begins its term with one), and a
    follower hears of its commit a moment after the leader. States that differ at one applied
    index are returned at once."""
    deadline = time.time() + timeout
    while True:
        digests = {member.node: group_digest(member.address, group) for member in members}
        indexes = {index for index, _ in digests.values()}
        if len(indexes) == 1 or time.time() >= deadline:
            return digests
        time.sleep(0.5)


def check_counter(members, ledger):
    """The counter plugin's total on every member against the increments' answers: (problems,
    the total, or None if the members disagree or it could not be read)."""
    problems = []
    finals = {}
    for member in members:
        code, body = call_raw(member.address, "GET",
                              f"/v1/plugins/counter/keys/{COUNTER_KEY}?consistency=stale")
        if code == 200 and len(body) == 8:
            finals[member.node] = int.from_bytes(body, "little", signed=True)
        else:
            finals[member.node] = 0 if code == 404 else f"HTTP {code}"
    if len(set(finals.values())) != 1:
        return [f"counter: the members hold different totals: {finals}"], None
    final = finals[members[0].node]
    if not isinstance(final, int):
        return [f"counter: not readable: {final}"], None
    return counter_problems(final, ledger.increments, ledger.increments_unknown), final


def counter_problems(final, increments, unanswered):
    """What contradicts a counter at `final` after `increments` were answered, each (time
    sent, time answered, total made), and `unanswered` more may have been applied (not
    answered, or answered without the promise that they did not apply)."""
    problems = []
    totals = [total for _, _, total in increments]
    twice = len(totals) - len(set(totals))
    if twice:
        problems.append(f"counter: {twice} totals answered to two increments")
    if totals and (min(totals) < 1 or max(totals) > final):
        problems.append(f"counter: totals answered {min(totals)}..{max(totals)}, final {final}")
    if final > len(totals) + unanswered:
        problems.append(f"counter: total {final} over the {len(totals)} increments answered "
                        f"and {unanswered} that may have applied: one applied twice, or one "
                        f"answered as not applied (safe to retry) was")
    # Real-time order: the largest total answered before an increment was sent is below the
    # total that increment made.
    by_answer = sorted(increments, key=lambda a: a[1])
    done, largest_done, late = 0, 0, 0
    for sent, _, total in sorted(increments):
        while done < len(by_answer) and by_answer[done][1] < sent:
            largest_done = max(largest_done, by_answer[done][2])
            done += 1
        late += largest_done >= total
    if late:
        problems.append(f"counter: {late} increments made a total at or below one answered "
                        f"before they were sent")
    return problems


def counter_check_controls():
    """Ledgers the counter check must pass and fail, tried before every run (each increment
    answered is (time sent, time answered, total))."""
    answered = [(0, 1, 1), (2, 3, 2), (2, 4, 3)]
    for what, final, unanswered in (("a sound ledger", 3, 0),
                                    ("one unanswered increment applied", 4, 1)):
        if counter_problems(final, answered, unanswered):
            raise RuntimeError(f"the counter check refuses {what}")
    bad = {
        "a total answered twice": (3, [(0, 1, 1), (2, 3, 1)], 1),
        "an increment applied twice": (5, answered, 1),
        "an answered increment lost": (2, answered, 0),
        "two increments out of real-time order": (3, [(0, 1, 2), (2, 3, 1), (2, 4, 3)], 0),
    }
    for what, (final, increments, unanswered) in bad.items():
        if not counter_problems(final, increments, unanswered):
            raise RuntimeError(f"the counter check misses {what}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--concord", default="target/release/concord")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--duration-secs", type=float, default=300)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server-args", default="",
                        help="more `concord serve` flags for every member, e.g. '--backend redb'")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="the faults to choose from, comma-separated")
    parser.add_argument("--calm-secs", type=float, default=2.0,
                        help="seconds between a member being ready again and the next fault")
    parser.add_argument("--overlap", type=float, default=0.0,
                        help="the probability that a fault is joined by a second one on "
                             "another member (0 to 1; see above)")
    parser.add_argument("--relay", action="store_true",
                        help="every peer connection goes through the proxy even when no "
                             "fault chosen uses it (with peer TLS: a TCP relay on the path)")
    parser.add_argument("--backup-every-secs", type=float, default=30.0,
                        help="seconds between two backups through a random member while the "
                             "faults go on (0: none)")
    parser.add_argument("--counter-plugin", default=COUNTER_PLUGIN,
                        help="the counter plugin every member serves and a tenth of the "
                             "requests increment; '' to leave it out")
    args = parser.parse_args()
    server_args = args.server_args.split()
    counter_check_controls()
    if args.counter_plugin:
        server_args += ["--plugin", f"counter={os.path.abspath(args.counter_plugin)}"]
    faults_chosen = args.faults.split(",")
    if not faults_chosen or any(f not in FAULTS for f in faults_chosen):
        parser.error(f"--faults: choose from {','.join(FAULTS)}")
    if not 0.0 <= args.overlap <= 1.0:
        parser.error("--overlap: a probability from 0 to 1")

    disk = None
    if "slow-disk" in faults_chosen:
        try:
            disk = SlowDisk(tempfile.gettempdir())
        except OSError as error:
            if args.faults != parser.get_default("faults"):
                parser.error(f"--faults slow-disk: {error}")
            print(f"left out slow-disk: {error}", file=sys.stderr)
            faults_chosen.remove("slow-disk")

    chooser = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="concord-chaos-")
    faulty_disks = None
    if "disk-errors" in faults_chosen:
        try:
            faulty_disks = FaultyDisks(root)
        except OSError as error:
            if args.faults != parser.get_default("faults"):
                parser.error(f"--faults disk-errors: {error}")
            print(f"left out disk-errors: {error}", file=sys.stderr)
            faults_chosen.remove("disk-errors")
    proxied = [fault for fault in faults_chosen if fault in PROXIED]
    if proxied and any(arg.startswith("--peer-tls") for arg in server_args):
        # The proxy learns who dials from the hello, which TLS encrypts: it could cut or slow
        # no link, and these faults would do nothing.
        why = "the proxy tells who dials by the hello, which peer TLS hides"
        if args.faults != parser.get_default("faults"):
            parser.error(f"--faults {','.join(proxied)}: {why}")
        print(f"left out {', '.join(proxied)}: {why}", file=sys.stderr)
        faults_chosen = [fault for fault in faults_chosen if fault not in PROXIED]
    proxy = PartitionProxy() if args.relay or set(PROXIED) & set(faults_chosen) else None
    addresses, listen = {}, {}
    for node in (1, 2, 3):
        addresses[node], listen[node] = raft_address(node, proxy)
    flag = ",".join(f"{node}={address}" for node, address in addresses.items())
    members = [Member(args.concord, node, flag, os.path.join(root, str(node)), args.groups,
                      server_args + listen[node])
               for node in (1, 2, 3)]
    for member in members if faulty_disks else ():
        faulty_disks.attach(member)
    ledger = Ledger()
    stop = threading.Event()
    threads = []
    cluster = None
    faults = []
    overlapped = []  # the second faults `--overlap` added
    problems = []
    asleep = []  # groups asleep on a member, sampled during the run
    counter = bool(args.counter_plugin)
    counter_total = None
    backups = None
    backups_checked = ""
    try:
        start_cluster(members)
        cluster = Cluster(members, addresses, proxy, disk, faulty_disks, server_args)
        threads = [threading.Thread(target=writer,
                                    args=(i, cluster, ledger, stop, args.seed, counter))
                   for i in range(args.writers)]
        threads.append(threading.Thread(target=count_sleeping, args=(cluster, stop, asleep)))
        for t in threads:
            t.start()
        if args.backup_every_secs > 0:
            backups = Backups(args.concord, cluster, ledger, root, args.backup_every_secs,
                              args.seed)
            backups.start()
        started = time.time()
        while time.time() - started < args.duration_secs:
            time.sleep(args.calm_secs)
            fault, victim = chooser.choice(faults_chosen), chooser.choice(cluster.members)
            at = time.time() - started
            nodes = ",".join(str(m.node) for m in victims_of(fault, victim, cluster.members))
            second = second_fault(fault, victim, cluster, chooser, faults_chosen, args.overlap)
            second_outcome = []
            second_thread = None
            if second is not None:
                second_thread = threading.Thread(target=run_second,
                                                 args=(second, cluster, root, second_outcome))
                second_thread.start()
            problem = inject(fault, victim, cluster, chooser, root)
            if second_thread is not None:
                second_thread.join()
            took = time.time() - started - at
            faults.append(fault)
            if fault == "replace":
                done = f"node {cluster.members[-1].node} in its place after {took:.1f} s"
            elif fault in PROXIED or fault in ("retick", "slow-disk", "disk-errors"):
                done = cluster.note
            else:
                done = f"ready again after {took:.1f} s"
            print(f"{at:7.1f} s  {fault:11} node {nodes:6}: {done}", flush=True)
            if second is not None:
                second_fault_name, second_member, _ = second
                second_problem, second_took = second_outcome[0] if second_outcome else (
                    "the second fault did not finish", 0.0)
                overlapped.append(second_fault_name)
                print(f"{'':9}  + {second_fault_name:9} node {second_member.node:<6}: "
                      f"ready again after {second_took:.1f} s", flush=True)
                problem = problem or second_problem
            if problem:
                problems.append(problem)
                break
        stop.set()
        for t in threads:
            t.join()
        if backups is not None:
            backups.stop()
        members = cluster.members
        for member in members:
            if member.process.poll() is not None:
                # A member that a problem left stopped starts again on its data, so that every
                # acknowledged write is still checked on every member.
                print(f"node {member.node} had stopped; started again for the checks", flush=True)
                member.start("new")
                member.wait_listening()
                member_ready(member)
        if not converged(members):
            problems.append("the members' applied indexes did not meet within 180 s")
        problems += check(members, ledger)
        if counter:
            found, counter_total = check_counter(members, ledger)
            problems += found
        problems += ledger.contradictions
        problems += ledger.writers_stopped
        if backups is not None:
            problems += backups.problems
            found, backups_checked = backups.check_last(
                server_args, args.groups, counter_total if counter else None)
            problems += found
    finally:
        stop.set()
        if backups is not None and backups.thread.is_alive():
            backups.stop()
        stop_all(cluster.started if cluster else members, root, keep_data=bool(problems))
        if proxy:
            proxy.stop()
        if disk:
            disk.close()
        if problems:
            print(f"data directories kept in {root}", file=sys.stderr)

    by_fault = {f: faults.count(f) for f in FAULTS}
    second_by_fault = {f: overlapped.count(f) for f in OVERLAPPING}
    print(f"faults: {by_fault}; answers: {dict(sorted(ledger.counts.items()))}")
    if args.overlap > 0:
        print(f"second faults beside them: {second_by_fault}")
    print(f"checked {len(ledger.present)} sessions present, {len(ledger.deleted)} deleted, "
          f"{len(ledger.not_created)} never made (answered as safe to retry), "
          f"{len(ledger.unknown)} deletes without an answer; problems: {len(problems)}")
    asleep.sort()
    sleeping = {"samples": len(asleep), "min": asleep[0] if asleep else None,
                "median": asleep[len(asleep) // 2] if asleep else None,
                "max": asleep[-1] if asleep else None}
    print(f"groups asleep on a member, every {SLEEP_SAMPLE_SECS} s: {sleeping}")
    counted = {"increments_answered": len(ledger.increments),
               "increments_that_may_have_applied": ledger.increments_unknown,
               "total": counter_total}
    if counter:
        print(f"counter: {counted}")
    if backups is not None:
        print(f"backups: {dict(sorted(backups.counts.items()))}; {backups_checked}")
    for problem in problems[:20]:
        print("  " + problem)
    print(json.dumps({"case": "cluster_chaos", "seed": args.seed, "groups": args.groups,
                      "server_args": args.server_args, "relay": proxy is not None,
                      "duration_secs": args.duration_secs, "faults": by_fault,
                      "overlap": args.overlap,
                      "second_faults": second_by_fault if args.overlap > 0 else None,
                      "answers": ledger.counts, "present_checked": len(ledger.present),
                      "deleted_checked": len(ledger.deleted),
                      "not_created_checked": len(ledger.not_created), "asleep_groups": sleeping,
                      "counter": counted if counter else None,
                      "backups": dict(backups.counts) if backups else None,
                      "problems": len(problems)}))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
