"""The consumer's asynchronous committer: one background thread, one FIFO queue.

Kafka's ``commitAsync`` promises that callbacks run in the order the commits were made and that
an earlier commit's retry never lands after a later commit (which would move the committed
offset backwards). One thread taking jobs strictly in order gives both: a job's retries (under
``ERROR_POLICY``, inside ``Generation.commit_offsets``) finish before the next job starts.

Callbacks do not run on this thread: each finished job is queued as a completion, and the
consumer runs the completions from the thread that calls ``poll()``, ``commit()`` or
``close()``, as Kafka does, so a callback never runs concurrently with the application.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConnectionLost
from ..protocol.offsets import TopicPartition
from .inflight import IDLE_EXIT_S

__all__ = ["AsyncCommitter", "Completion", "OffsetCommitCallback"]

log = logging.getLogger("rcoord.client")

OffsetCommitCallback = Callable[[dict[TopicPartition, int], BaseException | None], Any]
"""``callback(offsets, exception)``: Kafka's ``OffsetCommitCallback.onComplete``; ``exception``
is None when the commit succeeded."""


@dataclass(frozen=True)
class Completion:
    """A finished asynchronous commit, waiting for its callback to run."""

    offsets: dict[TopicPartition, int]
    error: BaseException | None
    callback: OffsetCommitCallback | None
    token: object  # what the consumer needs to apply the result (the generation)
    ticket: int = 0  # the job's, as ``submit`` returned it


@dataclass(frozen=True)
class _Job:
    run: Callable[[], None]
    offsets: dict[TopicPartition, int]
    callback: OffsetCommitCallback | None
    token: object


class AsyncCommitter:
    """Runs commit jobs one at a time in submission order; the thread starts on first use
    (and ends after ``IDLE_EXIT_S`` with nothing to do: every auto-committing consumer has
    one, and one dropped without ``close()`` must not keep it)."""

    def __init__(self, name: str, idle_exit_s: float = IDLE_EXIT_S) -> None:
        self._name = name
        self._idle_exit_s = idle_exit_s
        self._cond = threading.Condition()
        self._jobs: deque[_Job] = deque()
        self._done: deque[Completion] = deque()
        self._submitted = 0
        self._finished = 0
        self._closed = False
        # Set by give_up(); then, once a job could not reach the coordinator, the jobs left
        # are failed unsent (_unreachable).
        self._given_up = False
        self._unreachable = False
        self._thread: threading.Thread | None = None

    def submit(
        self,
        run: Callable[[], None],
        offsets: dict[TopicPartition, int],
        callback: OffsetCommitCallback | None,
        token: object = None,
    ) -> int:
        """Queue ``run`` (which commits ``offsets`` or raises) behind every earlier job; returns
        the job's ticket, for ``finished`` and ``wait_idle(upto=...)``."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the committer is closed")
            self._jobs.append(_Job(run, offsets, callback, token))
            self._submitted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return self._submitted

    def complete_now(
        self,
        offsets: dict[TopicPartition, int],
        error: BaseException | None,
        callback: OffsetCommitCallback | None,
    ) -> None:
        """Queue an outcome known at submission (an empty commit, a refusal) behind the earlier
        jobs, so its callback keeps its place in the order."""

        def known() -> None:
            if error is not None:
                raise error

        self.submit(known, offsets, callback)

    def finished(self, ticket: int) -> bool:
        """Whether the job of ``ticket`` (and so every job before it) has finished."""
        with self._cond:
            return self._finished >= ticket

    def completed(self, ticket: int) -> Completion | None:
        """The outcome of the finished job ``ticket``, while ``take_completion`` has not
        taken it yet (None otherwise, or not finished)."""
        with self._cond:
            return next((done for done in self._done if done.ticket == ticket), None)

    def wait_idle(
        self, timeout: float | None = None, *interrupts: threading.Event, upto: int | None = None
    ) -> bool:
        """Wait until every job submitted so far (or up to the ticket ``upto``) has finished;
        False on timeout, or as soon as one of ``interrupts`` is set (whoever sets it calls
        ``interrupt_waits()``, which wakes the wait up to see it)."""
        with self._cond:
            target = self._submitted if upto is None else upto
            self._cond.wait_for(
                lambda: self._finished >= target or any(e.is_set() for e in interrupts),
                timeout,
            )
            return self._finished >= target

    def interrupt_waits(self) -> None:
        """Make every ``wait_idle()`` look at its ``interrupts`` now."""
        with self._cond:
            self._cond.notify_all()

    @property
    def last_ticket(self) -> int:
        """The ticket of the job submitted last (0 before the first): ``wait_idle(upto=...)``
        with it waits for the jobs queued so far, not for those queued after."""
        with self._cond:
            return self._submitted

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet finished."""
        with self._cond:
            return self._submitted - self._finished

    def take_completion(self) -> Completion | None:
        """The oldest finished job not taken yet, or None: one at a time, so that a callback's
        own ``commit()`` first takes those finished before it, in order."""
        with self._cond:
            return self._done.popleft() if self._done else None

    def give_up(self) -> None:
        """The consumer's close() timeout passed: stop spending time on an unreachable
        coordinator. Each job left is still sent once while the coordinator answers (a commit
        made before close() is not dropped because close() was short); once one fails with
        ``ConnectionLost``, every job after it fails with ``ConnectionLost`` unsent, at once,
        its callback still run in order. (The retries inside a job are stopped by the group,
        ``ConsumerGroup.stop_retrying``.)"""
        with self._cond:
            self._given_up = True
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued jobs (within ``timeout``), then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs) or self._closed, self._idle_exit_s)
                if not self._jobs:
                    self._thread = None  # closed, or idle: the next submit() makes a new one
                    return
                job = self._jobs[0]
                ticket = self._finished + 1  # (jobs finish in submission order)
                unsent = self._unreachable
            error: BaseException | None = None
            if unsent:
                error = ConnectionLost(
                    "commit not sent: close()'s timeout passed and an earlier commit could not "
                    "reach the coordinator"
                )
            else:
                try:
                    job.run()
                except Exception as exc:  # noqa: BLE001 - handed to the callback, in order
                    error = exc
            with self._cond:
                if self._given_up and isinstance(error, ConnectionLost):
                    self._unreachable = True
                self._jobs.popleft()
                self._done.append(Completion(job.offsets, error, job.callback, job.token, ticket))
                self._finished += 1
                self._cond.notify_all()
