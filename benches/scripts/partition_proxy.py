"""A TCP proxy in front of each `concord` member's raft port that can cut or slow the links
between members: a network partition or a slow network between real processes, for
`cluster_chaos.py`.

Members dial each other at the proxies' addresses (given in `--initial-cluster`, and as the
raft address of a member added later); each member listens on the port its proxy forwards to
(`--raft-addr`). The proxy reads the hello that opens every peer connection to learn which
member dials (the node id follows the magic, the wire version and the cluster id), and forwards
only while that link is not cut. A link is cut in one of two ways:

  closed  its open connections are closed and new ones are closed after the hello, as a
          peer's crash looks to the dialler;
  silent  its connections stay open and carry nothing, either way, until the link heals (a new
          one waits after its hello): packets lost, as TCP sees a partition — the dialler's
          writes back up, only silence tells, and what waited is delivered late on healing.

A link is slowed by a delay: every byte it carries, either way, is delivered that long after
the proxy read it (a long, slow path between machines: order kept, nothing lost). A delay may
jitter: each read then waits the delay plus its own random share of the jitter, and never
overtakes the read before it (a path whose latency swings, as one TCP stream sees it: a late
read holds back those behind it). Healing ends delays too; what waited goes at once.
"""

import collections
import random
import socket
import struct
import threading
import time

# Bytes of the hello before the dialling node's id, and the id's own.
NODE_ID_AT = 4 + 2 + 8
NODE_ID_BYTES = 8
# Bytes a delayed direction holds before it stops reading (its sender then waits, as TCP's
# would for a full window).
MAX_HELD_BYTES = 16 << 20


class PartitionProxy:
    def __init__(self):
        self.changed = threading.Condition()
        self.closed = set()  # (from, to) links cut by closing their connections
        self.silent = set()  # (from, to) links cut by holding their bytes
        self.delays = {}  # (from, to) -> (seconds each byte waits, seconds of jitter on top)
        self.open = set()  # (from, to, client socket, upstream socket) of open connections
        self.listeners = []
        self.stopped = False

    def add(self, node, target_port):
        """Starts the proxy of member `node`, which listens for raft on `target_port`;
        returns the address the other members dial it at."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self.listeners.append(listener)
        threading.Thread(target=self._accept, args=(listener, node, target_port),
                         daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    def cut_link(self, source, target, silent=False):
        """Cuts the connections `source` dials to `target`: closed, or `silent`."""
        with self.changed:
            if silent:
                self.silent.add((source, target))
                return
            self.closed.add((source, target))
            closing = [c for c in self.open if (c[0], c[1]) == (source, target)]
        for connection in closing:
            close(connection[2], connection[3])

    def delay_link(self, source, target, seconds, jitter_seconds=0.0):
        """Delays what `source` and `target` send each other on the connections `source`
        dials by `seconds`, each read by up to `jitter_seconds` more (its own draw)."""
        with self.changed:
            self.delays[(source, target)] = (seconds, jitter_seconds)

    def heal(self):
        with self.changed:
            self.closed.clear()
            self.silent.clear()
            self.delays.clear()
            self.changed.notify_all()

    def stop(self):
        for listener in self.listeners:
            listener.close()
        with self.changed:
            self.stopped = True
            self.changed.notify_all()
            closing = list(self.open)
        for connection in closing:
            close(connection[2], connection[3])

    def _passes(self, link):
        """Waits while `link` is silent; then whether it forwards (not closed, not stopped)."""
        with self.changed:
            while link in self.silent and not self.stopped:
                self.changed.wait()
            return link not in self.closed and not self.stopped

    def _accept(self, listener, target, target_port):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # Stopped.
            threading.Thread(target=self._forward, args=(client, target, target_port),
                             daemon=True).start()

    def _forward(self, client, target, target_port):
        head = receive_exactly(client, NODE_ID_AT + NODE_ID_BYTES)
        if head is None:
            client.close()
            return
        (source,) = struct.unpack_from("<Q", head, NODE_ID_AT)
        link = (source, target)
        if not self._passes(link):
            client.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", target_port), timeout=5)
            upstream.settimeout(None)
            upstream.sendall(head)
        except OSError:
            client.close()
            return
        connection = (source, target, client, upstream)
        with self.changed:
            forwarding = link not in self.closed and not self.stopped
            if forwarding:
                self.open.add(connection)
        if not forwarding:
            close(client, upstream)
            return
        back = threading.Thread(target=self._pump, args=(upstream, client, link), daemon=True)
        back.start()
        self._pump(client, upstream, link)
        back.join()
        with self.changed:
            self.open.discard(connection)
        client.close()
        upstream.close()

    def _pump(self, source, sink, link):
        """Copies `source` to `sink` until either ends or the link is closed; then ends both
        directions. What it reads waits in a queue, stamped with when, for a sender thread
        (`_send_held`) to send once the link's delay has passed."""
        queue = HeldBytes()
        sender = threading.Thread(target=self._send_held, args=(queue, sink, link), daemon=True)
        sender.start()
        try:
            while True:
                data = source.recv(65536)
                if not queue.put(data or None):
                    break
                if not data:
                    break
        except OSError:
            queue.put(None)
        sender.join()
        close(source, sink)

    def _send_held(self, queue, sink, link):
        """Sends what `queue` holds, each read once the link's delay has passed since it was
        read, holding it while the link is silent; ends the queue when done."""
        try:
            while True:
                read_at, share, data = queue.first()
                if data is None:
                    return
                while True:
                    with self.changed:
                        seconds, jitter_seconds = self.delays.get(link, (0.0, 0.0))
                    wait = read_at + seconds + share * jitter_seconds - time.monotonic()
                    if wait <= 0:
                        break
                    time.sleep(min(wait, 0.05))  # A heal ends the delay early.
                if not self._passes(link):
                    return
                sink.sendall(data)
                queue.pop()
        except OSError:
            pass
        finally:
            queue.end()
            close(sink)


class HeldBytes:
    """What one direction of a connection read and has not sent yet: `(read at, share of the
    jitter it waits, bytes)` oldest first, `None` bytes once the source ended. Bounded: past MAX_HELD_BYTES the reader
    waits, as a sender does behind a full TCP window."""

    def __init__(self):
        self.items = collections.deque()
        self.bytes = 0
        self.ended = False  # the sender stopped: nothing more is taken
        self.changed = threading.Condition()

    def put(self, data):
        """Adds `data` (None: the source ended); False if the sender stopped."""
        with self.changed:
            while self.bytes > MAX_HELD_BYTES and not self.ended:
                self.changed.wait()
            if self.ended:
                return False
            self.items.append((time.monotonic(), random.random(), data))
            self.bytes += len(data) if data else 0
            self.changed.notify_all()
            return True

    def first(self):
        with self.changed:
            while not self.items:
                self.changed.wait()
            return self.items[0]

    def pop(self):
        with self.changed:
            _, _, data = self.items.popleft()
            self.bytes -= len(data)
            self.changed.notify_all()

    def end(self):
        with self.changed:
            self.ended = True
            self.changed.notify_all()


def receive_exactly(sock, count):
    data = b""
    while len(data) < count:
        try:
            chunk = sock.recv(count - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def close(*sockets):
    """Shuts both directions of each socket down (its pump threads then end and close it)."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
