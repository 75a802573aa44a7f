"""What one webhook POST costs slawatch's process, by how far into httpx it goes.

The lean outbox's delivery side (docs/performance.md, "The lean outbox: the delivery
side measured") found the workers' Python the bound once the database is out of the
way, and the POST half of it. This times, in the client's own process (CPU, not wall
time: the receiver is another process), one POST of a batch of 100 alerts made by
slawatch's own ``alert_payload`` and encoded as the webhook notifier does, four ways:

- ``Client.stream``: what ``HttpNotifier.post`` did before it sent through httpcore's
  pool: httpx's ``Client.stream`` with a per-request timeout, the answer drained;
- ``transport``: the same request handed to an ``httpx.HTTPTransport`` directly
  (``handle_request``): no Client (its URL merging, default headers, auth, cookies,
  event hooks and redirect handling), still httpx's Request and Response;
- ``httpcore``: httpx's own transport library, ``httpcore.ConnectionPool.stream``,
  with bytes for headers: no httpx objects at all;
- ``post``: ``HttpNotifier.post`` itself (slawatch/delivery/notifiers/http.py), a
  webhook notifier's: the headers httpx.Client would send, on a kept-alive socket of its
  own (slawatch/delivery/notifiers/wire.py).

Each round runs each way ``--posts`` times, interleaved, the order turning each round;
the figures are medians of ``--rounds``. The receiver is a threaded ``http.server`` in a
child process, HTTP/1.1 with keep-alive, answering 200 and ``{}``.

    .venv/bin/python bench/http_client.py [--posts 1500] [--rounds 5] [--alerts 100]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpcore
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slawatch.config.notifiers import WebhookConfig  # noqa: E402
from slawatch.delivery.notifiers.base import encode  # noqa: E402
from slawatch.delivery.notifiers.webhook import WebhookNotifier  # noqa: E402
from slawatch.engine.outbox import alert_payload  # noqa: E402

RECEIVER = """
import http.server, socketserver, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are two writes: with Nagle's algorithm the body waited for
    # the client's delayed ACK of the head, 40 ms a POST (the CPU figures were right,
    # a run took minutes).
    disable_nagle_algorithm = True
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def body(alerts: int) -> bytes:
    now = datetime(2026, 3, 1, tzinfo=UTC)
    rows = [
        {
            "rule": "order_unshipped",
            "key": str(i),
            "episode": 1,
            "n": 1,
            "severity": "warning",
            "deadline": now - timedelta(hours=1),
            "due_at": now - timedelta(hours=1),
            "fired_at": now,
            "row_data": {"id": i, "user_id": 7, "total_cents": 1999, "status": "paid"},
        }
        for i in range(alerts)
    ]
    return encode({"alerts": [alert_payload(r, "a paid order not shipped") for r in rows]})


def ways(url: str, content: bytes) -> dict[str, Callable[[], None]]:
    headers = {"content-type": "application/json", "webhook-id": "msg_bench"}
    client = httpx.Client(timeout=5, follow_redirects=False, headers={"user-agent": "bench"})

    def by_client() -> None:
        with client.stream("POST", url, content=content, headers=headers, timeout=5) as r:
            assert r.status_code == 200
            for _ in r.iter_raw():
                pass

    transport = httpx.HTTPTransport()
    full = {**headers, "user-agent": "bench"}

    def by_transport() -> None:
        request = httpx.Request("POST", url, content=content, headers=full)
        request.extensions["timeout"] = httpx.Timeout(5).as_dict()
        r = transport.handle_request(request)
        try:
            assert r.status_code == 200
            for _ in r.iter_raw():
                pass
        finally:
            r.close()

    pool = httpcore.ConnectionPool()
    target = httpcore.URL(url)
    raw = [(k.encode(), v.encode()) for k, v in full.items()]
    raw.append((b"host", target.host + b":" + str(target.port).encode()))
    timeout = {"timeout": {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}}

    def by_httpcore() -> None:
        with pool.stream("POST", target, headers=raw, content=content, extensions=timeout) as r:
            assert r.status == 200
            for _ in r.iter_stream():
                pass

    config = {"name": "bench", "type": "webhook", "url": url, "timeout": "5s"}
    notifier = WebhookNotifier(WebhookConfig.model_validate(config))
    extra = {"webhook-id": "msg_bench"}

    def by_post() -> None:
        assert notifier.post(url, content, extra) == 200

    return {
        "Client.stream": by_client,
        "transport": by_transport,
        "httpcore": by_httpcore,
        "post": by_post,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--posts", type=int, default=1500, help="POSTs per way per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--alerts", type=int, default=100, help="alerts per POST")
    args = parser.parse_args()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        content = body(args.alerts)
        each = ways(f"http://127.0.0.1:{port}/hook", content)
        spent: dict[str, list[float]] = {name: [] for name in each}
        names = list(each)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                post = each[name]
                post()  # the connection made before the clock starts
                started = time.process_time()
                for _ in range(args.posts):
                    post()
                spent[name].append((time.process_time() - started) / args.posts * 1e6)
        base = statistics.median(spent["Client.stream"])
        print(f"one POST of {args.alerts} alerts ({len(content):,} bytes), client CPU,")
        print(f"medians of {args.rounds} rounds of {args.posts}:")
        for name, values in spent.items():
            m = statistics.median(values)
            print(f"  {name:14} {m:8.1f} µs  {m / base:5.2f}x Client.stream")
    finally:
        receiver.terminate()
        receiver.wait()


if __name__ == "__main__":
    main()
