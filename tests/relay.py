"""A TCP relay that a test can cut, heal, hold and release: a link between two hosts."""

from __future__ import annotations

import socket
import threading

OTHER_LOOPBACK = "127.0.0.2"  # nothing of the cluster binds it


class Relay:
    """Forwards TCP connections to ``upstream`` until :meth:`cut`, which drops them all.

    After a cut new connections are accepted and never answered, as when the
    packets between two hosts are lost; :meth:`heal` forwards again.
    :meth:`hold` keeps what is sent on open connections from arriving until
    :meth:`release`, as a slow or congested link delivers it late.
    """

    def __init__(self, upstream: str, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(listen)
        self.address = "{}:{}".format(*self.listener.getsockname()[:2])
        self.cut_off = threading.Event()
        self.flowing = threading.Event()
        self.flowing.set()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(client)
            if self.cut_off.is_set():
                continue  # held open, never answered
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.cut_off.is_set():
                data = src.recv(65536)
                if not data:
                    break
                self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.cut_off.set()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def heal(self) -> None:
        self.cut_off.clear()

    def hold(self) -> None:
        self.flowing.clear()

    def release(self) -> None:
        self.flowing.set()

    def close(self) -> None:
        self.release()
        self.cut()
        self.listener.close()


class Relays:
    """Cut and heal several relays together."""

    def __init__(self, relays: list[Relay]) -> None:
        self.relays = relays

    def cut(self) -> None:
        for r in self.relays:
            r.cut()

    def heal(self) -> None:
        for r in self.relays:
            r.heal()

    def close(self) -> None:
        for r in self.relays:
            r.close()
