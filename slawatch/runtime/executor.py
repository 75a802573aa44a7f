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
APScheduler's own (``max_instances``, listeners). A step's job hands the scans of its
rules with work to the same threads as plain calls (:meth:`ScanExecutor.call`,
Runner.scan_step), after the runs submitted before them.
"""

from __future__ import annotations

import bisect
import math
import queue
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from apscheduler.executors.base import BaseExecutor, run_job
from apscheduler.job import Job
from apscheduler.jobstores.base import ConflictingIdError, JobLookupError
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.util import datetime_to_utc_timestamp


class ScanExecutor(BaseExecutor):  # type: ignore[misc]
    """``threads`` threads, started with the scheduler (or when added to a running one),
    taking the runs in the order they were submitted. :meth:`shutdown` lets them finish
    every run submitted before it (as ``concurrent.futures`` does), then they end."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self.threads = max(int(threads), 1)
        # A job's run, a call (:meth:`call`), or None: a thread's end.
        self._runs: queue.SimpleQueue[tuple[Job, list[datetime]] | Callable[[], None] | None] = (
            queue.SimpleQueue()
        )
        self._workers: list[threading.Thread] = []
        self._closed = False
        # Held while a call is queued and while the executor closes: a call is either
        # refused or queued before the threads' ends, never after (it would never run).
        self._closing = threading.Lock()

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

    def call(self, run: Callable[[], None]) -> None:
        """Run ``run`` on a thread, after the runs submitted before it: a scan handed
        over by its step's job (Runner.scan_step), which is no job of APScheduler's.
        RuntimeError after :meth:`shutdown`."""
        with self._closing:
            if self._closed:
                raise RuntimeError("cannot run a call after the executor was shut down")
            self._runs.put(run)

    def _work(self) -> None:
        while True:
            item = self._runs.get()
            if item is None:
                return
            if not isinstance(item, tuple):
                try:
                    item()
                except Exception:  # the thread goes on with the next run
                    self._logger.exception("scan executor: a call failed")
                continue
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
        with self._closing:
            if self._closed:
                return
            self._closed = True
            for _ in self._workers:
                self._runs.put(None)
        if wait:
            for worker in self._workers:
                if worker is not threading.current_thread():
                    worker.join()


class ScanJobStore(MemoryJobStore):  # type: ignore[misc]
    """APScheduler's :class:`MemoryJobStore` (its jobs in RAM, ordered by next run time
    and id), whose lookups are :mod:`bisect`'s, in C, on a list of the jobs' sort keys
    kept beside its own, instead of its binary search in Python.

    The scheduler updates a job in its store after each run (its next run time moves
    it in the order): with a thousand rules that binary search over a thousand jobs,
    twice per run, was a sixth of what APScheduler spent per scan (docs/performance.md,
    the rules curve). The order, the due jobs and the errors are MemoryJobStore's."""

    def __init__(self) -> None:
        super().__init__()
        # (timestamp, job id) of each item of self._jobs, in the same order; a job
        # without a next run time (paused) sorts last, as in MemoryJobStore.
        self._keys: list[tuple[float, str]] = []

    @staticmethod
    def _key(timestamp: float | None, job_id: str) -> tuple[float, str]:
        return (math.inf if timestamp is None else timestamp, job_id)

    def _get_job_index(self, timestamp: float | None, job_id: str) -> int:
        return bisect.bisect_left(self._keys, self._key(timestamp, job_id))

    def add_job(self, job: Job) -> None:
        if job.id in self._jobs_index:
            raise ConflictingIdError(job.id)
        timestamp = datetime_to_utc_timestamp(job.next_run_time)
        index = self._get_job_index(timestamp, job.id)
        self._jobs.insert(index, (job, timestamp))
        self._keys.insert(index, self._key(timestamp, job.id))
        self._jobs_index[job.id] = (job, timestamp)

    def update_job(self, job: Job) -> None:
        old_job, old_timestamp = self._jobs_index.get(job.id, (None, None))
        if old_job is None:
            raise JobLookupError(job.id)
        old_index = self._get_job_index(old_timestamp, old_job.id)
        new_timestamp = datetime_to_utc_timestamp(job.next_run_time)
        if old_timestamp == new_timestamp:
            self._jobs[old_index] = (job, new_timestamp)
        else:
            del self._jobs[old_index]
            del self._keys[old_index]
            new_index = self._get_job_index(new_timestamp, job.id)
            self._jobs.insert(new_index, (job, new_timestamp))
            self._keys.insert(new_index, self._key(new_timestamp, job.id))
        self._jobs_index[old_job.id] = (job, new_timestamp)

    def remove_job(self, job_id: str) -> None:
        job, timestamp = self._jobs_index.get(job_id, (None, None))
        if job is None:
            raise JobLookupError(job_id)
        index = self._get_job_index(timestamp, job_id)
        del self._jobs[index]
        del self._keys[index]
        del self._jobs_index[job.id]

    def remove_all_jobs(self) -> None:
        super().remove_all_jobs()
        self._keys = []
