"""The outbox in rows (docs/explanation/outbox-rows.md) keeps the fenced writes of
docs/explanation/guarantees.md with real processes: a `slawatch run` stalled (SIGSTOP)
in the middle of a row past its lease, whose send another process took over and
finished, changes nothing when it wakes: its progress is refused, it sends no more of
the row, and only the chunk it had in flight reaches the receiver twice (same ids).

The other guarantees with rows are tested beside today's: the fault suite
(test_faults.py), per-episode order (test_order.py), crash recovery (test_crash.py), and
the Runner end to end (test_outbox_rows_e2e.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.conftest import ROOT
from tests.integration.helpers import Conn
from tests.receivers import Reply, WebhookReceiver
from tests.waiting import wait_until

RULE = """\
table: public.orders
key: id
deadline: paid_at
after: 1h
open_when: "status = 'paid'"
notify: [hook]
"""
ORDERS = 300  # three rows of 100
BATCH = 50  # each row in two chunks


def test_a_process_stalled_past_its_lease_changes_nothing_when_it_wakes(
    conn: Conn, dsn: str, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)")
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', now() - interval '1 day'"
        " FROM generate_series(1, %s::int) g",
        (ORDERS,),
    )
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "late.yaml").write_text(RULE)
    (tmp_path / "notifiers").mkdir()
    # Lease = 2 * timeout + 2 s = 4 s; one send in flight per process.
    (tmp_path / "notifiers" / "hook.yaml").write_text(
        f"type: webhook\nurl: {receiver.url}\nbatch: {BATCH}\ntimeout: 1s\nconcurrency: 1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLAWATCH_")} | {
        "SLAWATCH_HTTP": "",
        "SLAWATCH_DSN": dsn,
        "SLAWATCH_RULES_DIR": str(tmp_path / "rules"),
        "SLAWATCH_NOTIFIERS_DIR": str(tmp_path / "notifiers"),
        "SLAWATCH_OUTBOX": "rows",
    }
    slawatch = [sys.executable, "-m", "slawatch"]
    done = subprocess.run([*slawatch, "migrate"], env=env, cwd=ROOT, capture_output=True)
    assert done.returncode == 0, done.stderr
    # The first request is answered 2 s late: its sender is stopped before the answer.
    receiver.replies = [Reply(200, delay=2.0)]
    logs = {name: tmp_path / f"{name}.log" for name in ("stalled", "other")}
    with (
        logs["stalled"].open("wb") as out,
        subprocess.Popen([*slawatch, "run"], env=env, cwd=ROOT, stdout=out, stderr=out) as stalled,
    ):
        try:
            assert receiver.received.wait(30), "no delivery started"
            stalled.send_signal(signal.SIGSTOP)
            in_flight = [a["id"] for a in receiver.requests[0].alerts]
            assert len(in_flight) == BATCH
            with (
                logs["other"].open("wb") as out2,
                subprocess.Popen(
                    [*slawatch, "run"], env=env, cwd=ROOT, stdout=out2, stderr=out2
                ) as other,
            ):
                try:
                    # The other process takes the stalled one's send over once its lease
                    # ran out, and sends every row.
                    wait_until(lambda: sends(conn) == {"sent": 3}, "every send sent", timeout=60)
                    # Its chunk was taken by the receiver (kept as it came) and by the other.
                    assert receiver.alert_ids.count(in_flight[0]) == 2
                    stalled.send_signal(signal.SIGCONT)
                    # It wakes with its first chunk accepted: its progress is refused.
                    wait_until(
                        lambda: (
                            "lost the lease" in logs["stalled"].read_text(errors="replace")
                            or len(receiver.alert_ids) > ORDERS + BATCH
                        ),
                        "the stalled process to find its lease taken over",
                        timeout=30,
                    )
                finally:
                    other.kill()
        finally:
            stalled.send_signal(signal.SIGCONT)
            stalled.kill()
    ids = receiver.alert_ids
    assert set(ids) == {f"late:{k}:e1:n1" for k in range(1, ORDERS + 1)}
    repeated = Counter({i: n for i, n in Counter(ids).items() if n > 1})
    # Only the chunk it had in flight, once more; nothing more of its row.
    assert repeated == Counter(dict.fromkeys(in_flight, 2)), sorted(repeated)[:5]
    assert "lost the lease" in logs["stalled"].read_text(errors="replace")
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE done = 100 AND lease_owner IS NULL)"
        " FROM slawatch.outbox_send WHERE status = 'sent'"
    ).fetchone()
    assert row == (3,)


def sends(conn: Conn) -> dict[str, int]:
    """The row sends by status."""
    return dict(
        conn.execute("SELECT status, count(*) FROM slawatch.outbox_send GROUP BY 1").fetchall()
    )
