"""A TCP proxy on 127.0.0.1 in front of a real server, to take the server away
without stopping it: :meth:`TcpProxy.blackhole` keeps every connection open and
forwards nothing (a partitioned network), :meth:`TcpProxy.close` closes them and
the port (a server that is gone)."""

from __future__ import annotations

import contextlib
import socket
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class TcpProxy:
    """``listen``: the local port (default: any free one); a proxy closed and started
    again on its port is a server that went away and came back."""

    def __init__(self, host: str, port: int, listen: int = 0) -> None:
        self.host, self.target_port = host, port
        self._listener = socket.create_server(("127.0.0.1", listen))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._forward = threading.Event()
        self._forward.set()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @classmethod
    def for_dsn(cls, dsn: str) -> tuple[TcpProxy, str]:
        """A proxy in front of ``dsn``'s server (TCP), and the DSN through it."""
        params = conninfo_to_dict(dsn)
        proxy = cls(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        return proxy, make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = self._connect()
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:  # accepted just before the port closed: gone too
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _connect(self) -> socket.socket:
        if self.host.startswith("/"):  # libpq's socket folder (the embedded server)
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.connect(f"{self.host}/.s.PGSQL.{self.target_port}")
            return unix
        return socket.create_connection((self.host, self.target_port))

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self._forward.wait()
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def blackhole(self) -> None:
        """Forward nothing from now on; keep every connection open, accept new ones."""
        self._forward.clear()

    def close(self) -> None:
        """Close the port and every connection through it."""
        with self._lock:
            self._closed = True
        # close() alone leaves an accept() blocked in another thread accepting (Linux).
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        self._forward.set()  # the pipes wake, fail and end
