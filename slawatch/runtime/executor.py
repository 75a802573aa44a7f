"""The executor the rules' scan jobs run on: APScheduler's thread pool, less
``concurrent.futures``.

APScheduler's ``ThreadPoolExecutor`` hands each run to a ``concurrent.futures`` pool:
a ``Future`` (with its own condition and lock), a work item, a done-callback and a
look at whether to start a thread, at every run of every job. With a thousand rules
scanned every few seconds that is hundreds of runs a second, each an idle scan of one
cheap statement, and the hand-over cost a good part of what the scan itself did
(docs/performance.md, the rules curve). Here a run is one item on a queue that a fixed
set of threads take from: :func:`apscheduler.executors.base.run_job` runs it as it
did (misfires, the job's events), and the executor's instance count and events are
APScheduler's own (``max_instances``, listeners).
"""

from __future__ import annotations

import queue
import sys
import threading
from datetime import datetime
from typing import Any

from apscheduler.executors.base import BaseExecutor, run_job
from apscheduler.job import Job


class ScanExecutor(BaseExecutor):  # type: ignore[misc]
    """``threads`` threads, started with the scheduler (or when added to a running one),
    taking the runs in the order they were submitted. :meth:`shutdown` lets them finish
    every run submitted before it (as ``concurrent.futures`` does), then they end."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self.threads = max(int(threads), 1)
        self._runs: queue.SimpleQueue[tuple[Job, list[datetime]] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._closed = False

    def start(self, scheduler: Any, alias: str) -> None:
        super().start(scheduler, alias)
        if self._workers or self._closed:
            return
        for i in range(self.threads):
            worker = threading.Thread(target=self._work, name=f"{alias}_{i}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def _do_submit_job(self, job: Job, run_times: list[datetime]) -> None:
        if self._closed:
            raise RuntimeError("cannot run a job after the executor was shut down")
        self._runs.put((job, run_times))

    def _work(self) -> None:
        while True:
            item = self._runs.get()
            if item is None:
                return
            job, run_times = item
            # A thread that ended here would leave its share of the scans unrun, in
            # silence: whatever the run or APScheduler's bookkeeping of it raises is
            # logged and the thread takes the next run.
            try:
                try:
                    events = run_job(job, job._jobstore_alias, run_times, self._logger.name)
                except BaseException:
                    _, exc, tb = sys.exc_info()
                    self._run_job_error(job.id, exc, tb)
                else:
                    self._run_job_success(job.id, events)
            except Exception:
                self._logger.exception("scan executor: settling the run of job %s failed", job.id)

    def shutdown(self, wait: bool = True) -> None:
        """No more runs; the threads finish the runs submitted until now, then end
        (``wait``: this returns after that)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._runs.put(None)
        if wait:
            for worker in self._workers:
                if worker is not threading.current_thread():
                    worker.join()
