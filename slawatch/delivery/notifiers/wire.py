"""HTTP/1.1 POSTs on kept-alive sockets, for the HTTP notifiers' direct routes.

What httpcore's connection pool did for ``HttpNotifier.post`` (docs/performance.md, "The
lean outbox: the delivery side measured"), less its machinery per request: h11's events
and their validation, the pool's bookkeeping, a write for the head and another for the
body. A request is one buffer (its head exactly as h11 wrote it, then the body) sent
with one ``sendall``; the answer's head is parsed from the bytes read as h11 parses it
(lines ended by CRLF or LF, folded headers joined; what h11 refuses, refused), its body
framed by Content-Length, chunked encoding or the connection's end, as h11 frames it.
The whole exchange, the connection and its TLS handshake included, is bounded by one
deadline.

A connection is kept after an answer read to its end over HTTP/1.1 without
``Connection: close``: up to :data:`KEEP` idle ones, each for :data:`EXPIRY` seconds,
and, as httpcore does, never reused once it is readable while idle (the receiver closed
it, or sent what nobody asked for). Failures raise httpcore's exceptions, with the
texts httpcore gives them (``ConnectError: [Errno 111] Connection refused``,
``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``), so errors read as
before.
"""

from __future__ import annotations

import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpcore

READ = 65536  # bytes asked of each recv (httpcore's READ_NUM_BYTES)
HEAD_LIMIT = 65536  # an answer's head longer than this is refused
KEEP = 20  # idle connections kept (httpx's max_keepalive_connections)
EXPIRY = 5.0  # seconds an idle connection is kept (httpx's keepalive_expiry)
_CTL = (b"\r", b"\n", b"\x00")
# An answer's head ends at an empty line and its lines at LF, with or without CR before
# it, as h11 reads them; a line that starts with a space or a tab continues the header
# before it (obs-fold, which h11 joins with a space).
_HEAD_END = re.compile(rb"\n\r?\n")
_EOL = re.compile(rb"\r?\n")
_VERSION = re.compile(rb"HTTP/1\.[01]")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")

Head = list[tuple[bytes, bytes]]
Key = tuple[bytes, bytes, int]


def request_head(target: bytes, head: Head) -> bytes:
    """``POST target HTTP/1.1`` and the headers, as h11 writes them (Host first), and
    the empty line; a name or value with CR, LF or NUL is refused, as h11 refuses it."""
    lines = [b"POST ", target, b" HTTP/1.1\r\n"]
    for first in (True, False):
        for name, value in head:
            if (name.lower() == b"host") is first:
                lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    out = b"".join(lines)
    if any(c in name or c in value for name, value in head for c in _CTL) or b" " in target:
        raise httpcore.LocalProtocolError("Illegal header name, value or target")
    return out


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (or its end) while nothing was asked."""
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


class _Answer:
    """Reads one answer from ``sock``: its head, then its body's chunks (:meth:`body`),
    each read bounded by what is left until ``deadline`` (``time.monotonic()``): a
    receiver that drips its head, its chunks' lines or its trailers holds the worker no
    longer than the notifier's timeout, whatever it sends."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = b""
        self.complete = False  # the body was read to its end
        self.late = 0  # bytes read past the deadline

    def recv(self) -> bytes:
        left = self.deadline - time.monotonic()
        late = left <= 0
        if late:
            # Past the deadline, what has come already is still read (an answer that
            # came while this process was stopped: the receiver accepted), up to
            # HEAD_LIMIT bytes, without waiting for more than a millisecond.
            if self.late > HEAD_LIMIT:
                raise httpcore.ReadTimeout("timed out")
            left = 0.001
        try:
            self.sock.settimeout(left)
            got = self.sock.recv(READ)
            if late:
                self.late += len(got)
            return got
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    def head(self) -> tuple[int, bytes, bytes, Head]:
        """The status, HTTP version, reason phrase and headers of the first final answer
        (an informational 1xx is skipped, as h11 skips it)."""
        while True:
            while (end := _HEAD_END.search(self.buffer)) is None:
                if len(self.buffer) > HEAD_LIMIT:
                    raise httpcore.RemoteProtocolError("answer head too long")
                got = self.recv()
                if not got:
                    raise httpcore.RemoteProtocolError(
                        "Server disconnected without sending a response."
                    )
                self.buffer += got
            # The match starts at the first LF: a CR before it ends the last line.
            lines = _EOL.split(self.buffer[: end.start()].removesuffix(b"\r"))
            self.buffer = self.buffer[end.end() :]
            version, _, rest = lines[0].partition(b" ")
            code, _, reason = rest.partition(b" ")
            if not (_VERSION.fullmatch(version) and len(code) == 3 and code.isdigit()):
                raise httpcore.RemoteProtocolError("illegal status line")
            headers: Head = []
            for line in lines[1:]:
                if line[:1] in (b" ", b"\t"):  # folded: the header before goes on
                    if not headers:
                        raise httpcore.RemoteProtocolError("illegal header line")
                    name, value = headers.pop()
                    headers.append((name, (value + b" " + line.strip(b" \t")).strip(b" ")))
                    continue
                name, colon, value = line.partition(b":")
                if not colon or not _TOKEN.fullmatch(name) or b"\x00" in value:
                    raise httpcore.RemoteProtocolError("illegal header line")
                headers.append((name, value.strip(b" \t")))
            status = int(code)
            if status < 100:
                raise httpcore.RemoteProtocolError("illegal status line")
            if status >= 200:
                return status, version[5:], reason, headers
            if status == 101:
                raise httpcore.RemoteProtocolError("unexpected 101 Switching Protocols")

    def body(self, status: int, headers: Head) -> Iterator[bytes]:
        """The body's bytes as they come, framed as h11 frames an answer to a POST."""
        coding = length = None
        for name, value in headers:
            lower = name.lower()
            if lower == b"transfer-encoding":
                coding = value.lower()
            elif lower == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise httpcore.RemoteProtocolError("bad Content-Length")
                length = int(value)
        if status in (204, 304):
            self.complete = True
            return
        if coding is not None:
            if coding != b"chunked":
                raise httpcore.RemoteProtocolError("Only Transfer-Encoding: chunked is supported")
            yield from self._chunked()
        elif length is not None:
            yield from self._sized(length)
            self.complete = True
        else:  # until the receiver closes the connection
            while got := self.buffer or self.recv():
                self.buffer = b""
                yield got
            self.complete = True

    def _more(self) -> None:
        got = self.recv()
        if not got:
            raise httpcore.RemoteProtocolError(
                "peer closed connection without sending complete message body"
            )
        self.buffer += got

    def _sized(self, left: int) -> Iterator[bytes]:
        while left > 0:
            if not self.buffer:
                self._more()
            got, self.buffer = self.buffer[:left], self.buffer[left:]
            left -= len(got)
            yield got

    def _line(self) -> bytes:
        """The next line, without its end (LF, with or without CR before it)."""
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > HEAD_LIMIT:
                raise httpcore.RemoteProtocolError("chunk header too long")
            self._more()
        line, self.buffer = self.buffer[:end], self.buffer[end + 1 :]
        return line.removesuffix(b"\r")

    def _chunked(self) -> Iterator[bytes]:
        while True:
            size = self._line().partition(b";")[0].rstrip(b" \t")
            if not _CHUNK_SIZE.fullmatch(size):
                raise httpcore.RemoteProtocolError("illegal chunk size")
            left = int(size, 16)
            if left == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                self.complete = True
                return
            yield from self._sized(left)
            if self._line():
                raise httpcore.RemoteProtocolError("chunk not followed by CRLF")


class Wire:
    """Kept-alive HTTP/1.1 connections, shared by a notifier's workers."""

    def __init__(self, ssl_context: ssl.SSLContext) -> None:
        self._ssl = ssl_context
        self._lock = threading.Lock()
        self._idle: list[tuple[Key, socket.socket, float]] = []  # oldest first
        self._tls_ready = False

    def _checkout(self, key: Key) -> socket.socket | None:
        now = time.monotonic()
        stale: list[socket.socket] = []
        found = None
        with self._lock:
            kept = []
            for entry in self._idle:
                if now - entry[2] > EXPIRY:
                    stale.append(entry[1])
                else:
                    kept.append(entry)
            for i in range(len(kept) - 1, -1, -1):  # the most recently used first
                if kept[i][0] == key:
                    found = kept.pop(i)[1]
                    break
            self._idle = kept
        for sock in stale:
            sock.close()
        if found is not None and _readable(found):  # closed by the receiver meanwhile
            found.close()
            return self._checkout(key)
        return found

    def _checkin(self, key: Key, sock: socket.socket) -> None:
        with self._lock:
            self._idle.append((key, sock, time.monotonic()))
            extra = self._idle[:-KEEP] if len(self._idle) > KEEP else []
            del self._idle[: len(extra)]
        for _, old, _ in extra:
            old.close()

    def _connect(self, scheme: bytes, host: bytes, port: int, deadline: float) -> socket.socket:
        """A new connection, TLS's handshake included, within ``deadline``."""
        try:
            sock = socket.create_connection((host.decode("ascii"), port), _left(deadline))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        if scheme != b"https":
            return sock
        if not self._tls_ready:  # as httpcore sets it on the context it is given
            self._ssl.set_alpn_protocols(["http/1.1"])
            self._tls_ready = True
        try:
            sock.settimeout(_left(deadline))
            return self._ssl.wrap_socket(sock, server_hostname=host.decode("ascii"))
        except TimeoutError as exc:
            sock.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc

    @contextmanager
    def post(
        self, url: httpcore.URL, head: Head, body: bytes, deadline: float
    ) -> Iterator[tuple[int, Head, dict[str, Any], Iterator[bytes]]]:
        """POST ``body`` with ``head`` (the headers, Host among them) to ``url``: the
        answer's status, headers, extensions (``http_version``, ``reason_phrase``, as
        httpcore gives them) and body chunks; the whole exchange, from the connection to
        the answer's last byte, bounded by ``deadline`` (``time.monotonic()``). The
        connection is kept when the body was read to its end."""
        if deadline <= time.monotonic():
            raise httpcore.ConnectTimeout("timed out")
        port = url.port or (443 if url.scheme == b"https" else 80)
        key = (url.scheme, url.host, port)
        request = request_head(url.target, head) + body
        sock = self._checkout(key)
        if sock is None:
            sock = self._connect(url.scheme, url.host, port, deadline)
        keep = written = False
        try:
            # sendall's timeout is for the whole write (Python 3.5 on).
            sock.settimeout(_left(deadline))
            try:
                sock.sendall(request)
                written = True
            except TimeoutError as exc:
                raise httpcore.WriteTimeout(str(exc)) from exc
            except OSError:
                # As httpcore: a receiver may answer (a 413, say) and close before it
                # read the whole request; its answer is read all the same, and where
                # there is none, that is the error. The connection is not kept.
                pass
            answer = _Answer(sock, deadline)
            status, version, reason, headers = answer.head()
            extensions = {"http_version": b"HTTP/" + version, "reason_phrase": reason}
            yield status, headers, extensions, answer.body(status, headers)
            keep = written and answer.complete and version == b"1.1" and not _closes(headers)
        finally:
            if keep:
                self._checkin(key, sock)
            else:
                sock.close()

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for _, sock, _ in idle:
            sock.close()


def _left(deadline: float) -> float:
    """The seconds left until ``deadline`` as a socket's timeout: a millisecond at the
    least, so that an operation past it times out (and is handled as any timeout)."""
    return max(deadline - time.monotonic(), 0.001)


def _closes(headers: Head) -> bool:
    """Whether the answer says the connection closes after it (``Connection: close``)."""
    return any(
        name.lower() == b"connection" and b"close" in value.lower() for name, value in headers
    )
