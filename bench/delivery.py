"""End to end: alerts from claim to an in-process webhook receiver, batches of 100.

Burst: claims DUE overdue rows in claim batches while the delivery worker
(woken by the claim's NOTIFY) POSTs them to a receiver in this process:
alerts/s, and the claim-to-receipt latency (claim committed -> request
received), which here includes the wait behind the backlog. Trickle: SINGLES
claims of one row each, 50 ms apart: the latency of a lone alert. Beside them,
in the same run, the limit of the transport: the same JSON batches POSTed
straight to the same receiver, with no database.

    .venv/bin/python bench/delivery.py [--due 20000] [--claim-batch 1000]

Kept for the trickle latency; the benchmark of record is bench/run.py (realistic
~360-byte alerts, `slawatch run` in a subprocess, a steady 1,000 alerts/s).

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import psycopg
from benchdb import scratch_database
from psycopg_pool import ConnectionPool

from slawatch.claim import claim_batch, plan_claim
from slawatch.clock import Clock
from slawatch.deliver import Dispatcher
from slawatch.migrate import migrate
from slawatch.notifiers import WebhookConfig
from slawatch.notifiers.webhook import WebhookNotifier
from slawatch.rules import Rule


class Receiver:
    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.done = threading.Event()
        self.expect = 0
        me = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                now = time.perf_counter()
                for a in json.loads(body)["alerts"]:
                    me.arrived.setdefault(a["id"], now)
                if len(me.arrived) >= me.expect:
                    me.done.set()
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self, expect: int) -> None:
        self.arrived, self.expect = {}, expect
        self.done.clear()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(int(len(values) * p), len(values) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--due", type=int, default=20_000)
    parser.add_argument("--claim-batch", type=int, default=1000)
    parser.add_argument("--singles", type=int, default=100)
    args = parser.parse_args()

    receiver = Receiver()
    with scratch_database() as db, psycopg.connect(db, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        conn.execute("CREATE TABLE jobs (id bigint PRIMARY KEY, state text, beat timestamptz)")
        conn.execute(
            "INSERT INTO jobs SELECT g, 'running', now() - interval '1 hour'"
            " FROM generate_series(1, %s::int) g",
            (args.due + args.singles,),
        )
        rule = Rule.model_validate(
            {
                "name": "hung",
                "table": "jobs",
                "key": "id",
                "deadline": "beat",
                "after": "15m",
                "open_when": "state = 'running'",
                "batch": args.claim_batch,
                "notify": ["hook"],
            }
        )
        migrate(conn, [rule])
        conn.execute("VACUUM ANALYZE jobs")
        plan = plan_claim(rule, "timestamp with time zone")
        hook = WebhookNotifier(
            WebhookConfig(name="hook", type="webhook", url=receiver.url, batch=100)
        )
        receiver.reset(args.due)
        committed: dict[str, float] = {}
        with ConnectionPool(db, min_size=2, max_size=4, kwargs={"autocommit": True}) as pool:
            dispatcher = Dispatcher(db, pool, {"hook": hook}, Clock())
            dispatcher.start()
            time.sleep(0.5)
            start = time.perf_counter()
            key = 0
            while key < args.due:
                got = claim_batch(conn, plan, datetime.now(UTC))
                t = time.perf_counter()
                for _ in range(got):
                    key += 1
                    committed[f"hung:{key}:e1:n1"] = t
            receiver.done.wait(300)
            end = max(receiver.arrived.values())
            burst = [(receiver.arrived[i] - committed[i]) * 1000 for i in committed]
            # Trickle: one alert at a time, the receiver otherwise idle.
            receiver.reset(args.due + args.singles)
            single = plan_claim(rule.model_copy(update={"batch": 1}), "timestamp with time zone")
            committed = {}
            for _ in range(args.singles):
                claim_batch(conn, single, datetime.now(UTC))
                key += 1
                committed[f"hung:{key}:e1:n1"] = time.perf_counter()
                time.sleep(0.05)
            receiver.done.wait(60)
            dispatcher.stop()
            trickle = [(receiver.arrived[i] - committed[i]) * 1000 for i in committed]
        hook.close()
        e2e_rate = args.due / (end - start)

        # The transport's limit: the same batches, POSTed straight, no database.
        receiver.reset(args.due)
        alerts = [{"id": f"x:{k}:1", "rule": "x", "key": str(k), "n": 1} for k in range(args.due)]
        with httpx.Client() as client:
            t0 = time.perf_counter()
            for i in range(0, args.due, 100):
                client.post(receiver.url, content=json.dumps({"alerts": alerts[i : i + 100]}))
            raw_rate = args.due / (time.perf_counter() - t0)
    receiver.server.shutdown()

    print(
        f"PostgreSQL {version[0] if version else '?'}; {args.due:,} alerts, claim batch "
        f"{args.claim_batch:,}, webhook batch 100\n"
    )
    print(f"{'path':<44} {'alerts/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    print(
        f"{'burst: claim -> outbox -> webhook receiver':<44} {e2e_rate:>9,.0f}"
        f" {statistics.median(burst):>8.1f} {pct(burst, 0.99):>8.1f}"
    )
    print(
        f"{'trickle: one alert at a time':<44} {'':>9}"
        f" {statistics.median(trickle):>8.1f} {pct(trickle, 0.99):>8.1f}"
    )
    print(f"{'POST the same batches, no database (limit)':<44} {raw_rate:>9,.0f} {'':>8} {'':>8}")


if __name__ == "__main__":
    main()
