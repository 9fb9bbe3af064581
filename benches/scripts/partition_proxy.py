"""A TCP proxy in front of each `concord` member's raft port that can cut the links between
members: a network partition between real processes, for `cluster_chaos.py`.

Members dial each other at the proxies' addresses (given in `--initial-cluster`, and as the
raft address of a member added later); each member listens on the port its proxy forwards to
(`--raft-addr`). The proxy reads the hello that opens every peer connection to learn which
member dials (the node id follows the magic, the wire version and the cluster id), and forwards
only while that link is not cut; cutting a link closes its open connections too.
"""

import socket
import struct
import threading

# Bytes of the hello before the dialling node's id, and the id's own.
NODE_ID_AT = 4 + 2 + 8
NODE_ID_BYTES = 8


class PartitionProxy:
    def __init__(self):
        self.lock = threading.Lock()
        self.cut = set()  # (from, to) links that are cut
        self.open = set()  # (from, to, client socket, upstream socket) of open connections
        self.listeners = []

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

    def cut_link(self, source, target):
        """Cuts what `source` sends to `target` (its connections to `target`)."""
        with self.lock:
            self.cut.add((source, target))
            closing = [c for c in self.open if (c[0], c[1]) == (source, target)]
        for connection in closing:
            close(connection[2], connection[3])

    def heal(self):
        with self.lock:
            self.cut.clear()

    def stop(self):
        for listener in self.listeners:
            listener.close()
        with self.lock:
            self.cut = {(None, None)}  # nothing new is forwarded
            closing = list(self.open)
        for connection in closing:
            close(connection[2], connection[3])

    def _is_cut(self, source, target):
        with self.lock:
            return self._is_cut_locked(source, target)

    def _is_cut_locked(self, source, target):
        return (source, target) in self.cut or (None, None) in self.cut

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
        if self._is_cut(source, target):
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
        with self.lock:
            cut = self._is_cut_locked(source, target)
            if not cut:
                self.open.add(connection)
        if cut:
            close(client, upstream)
            return
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
        with self.lock:
            self.open.discard(connection)
        client.close()
        upstream.close()


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


def pump(source, sink):
    """Copies `source` to `sink` until either ends; then ends both directions."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    close(source, sink)


def close(*sockets):
    """Shuts both directions of each socket down (its pump threads then end and close it)."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
