"""Concurrent commands of one blocking coordinator's threads, sent together in one pipeline.

A process that hosts many members of a group (worker threads, a Spark executor's tasks) sends
their JoinGroups and SyncGroups within a few ms of each other: when the initial delay ends, when
the leader's assignment arrives. Sent one by one, each costs the process a connection checkout,
a write, a blocking read and the GIL hand-overs around them, several times what the server spends
on it; on these machines a 250-thread process spent about 2 ms of CPU per member that way. Here a
thread that finds no batch in flight sends its command at once (alone, it is the plain call);
threads that come while a batch is in flight queue theirs, and the first of them sends the whole
queue as one pipeline when the batch in flight returns. Each thread gets its own reply or error:
a pipeline is not a transaction, and the commands are independent (each is one atomic function
call). On a cluster, a batch that fails as a whole (a master it addresses is down) is sent
again call by call, so calls for the other masters do not fail with it. Like ``rcoord.wake``,
only the blocking driver uses this.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis

__all__ = ["SharedCalls"]


_UNSET: Any = object()


class _Call:
    """One queued command and, once answered, its reply or error, or ``alone``: send it by
    yourself (its batch failed as a whole on a cluster); ``done`` (made only for a call that
    waits behind a batch in flight) is set when it is answered or its turn to send the queue
    has come (``sends``)."""

    __slots__ = ("alone", "command", "done", "error", "reply", "sends")

    def __init__(self, command: tuple[Any, ...]) -> None:
        self.command = command
        self.done: threading.Event | None = None
        self.reply: Any = _UNSET
        self.error: BaseException | None = None
        self.sends = False
        self.alone = False


class SharedCalls:
    """The batched commands of one blocking coordinator (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Call] = []
        self._sending = False
        self._pid = os.getpid()

    def execute(self, client: Any, command: tuple[Any, ...]) -> Any:
        """Send ``command`` (alone, or with the calls queued meanwhile) and return its reply;
        an error reply or a failed send is raised."""
        call = _Call(command)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's queue is not ours
                self._queue, self._sending, self._pid = [], False, os.getpid()
            self._queue.append(call)
            if self._sending:
                call.done = threading.Event()
            else:
                self._sending = call.sends = True
        if not call.sends:
            try:
                call.done.wait()  # type: ignore[union-attr]
            except BaseException:
                # Interrupted while waiting (a KeyboardInterrupt, a signal handler's
                # SystemExit): the turn to send may be, or become, this call's, and a turn
                # nobody takes would stall every later call of the coordinator.
                self._withdraw(call)
                raise
        if call.sends:
            self._send_queue(client)
        if call.alone:
            return client.execute_command(*command)
        return _outcome(call)

    def _withdraw(self, call: _Call) -> None:
        """Take a call whose thread stopped waiting out of the queue, unsent, and hand its turn
        to send (if it had come) to the next queued call. A call already taken into a batch is
        left to that batch's sender."""
        with self._lock:
            if not any(each is call for each in self._queue):
                return
            self._queue = [each for each in self._queue if each is not call]
            if call.sends:
                self._pass_turn()

    def _pass_turn(self) -> None:
        """The first queued call sends the next batch; none queued, no batch is in flight (the
        caller holds the lock)."""
        if self._queue:
            self._queue[0].sends = True
            self._queue[0].done.set()  # type: ignore[union-attr]
        else:
            self._sending = False

    def queued(self) -> int:
        """How many calls wait for the batch in flight to return (for tests and debugging)."""
        with self._lock:
            return len(self._queue)

    def _send_queue(self, client: Any) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        try:
            if len(batch) == 1:
                batch[0].reply = client.execute_command(*batch[0].command)
            else:
                _send_pipeline(client, batch)
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets it
            for each in batch:
                each.error = exc
            if len(batch) > 1 and hasattr(client, "get_node_from_key"):
                # redis-py fails a cluster pipeline as a whole when it cannot reach one of its
                # nodes (or finds no node for a slot): that says nothing of the calls for the
                # other masters, which must not fail with it. Each caller sends its own call
                # again, by itself (a group step is safe to send again, and the caller would
                # retry it anyway).
                for each in batch:
                    each.alone = True
        finally:
            with self._lock:
                self._pass_turn()  # the first call queued meanwhile sends the next batch
            for each in batch:
                if each.reply is _UNSET and each.error is None:  # the sender was interrupted
                    each.error = redis.ConnectionError(
                        "the call was not sent: the thread sending its batch was interrupted")
                if each.done is not None:
                    each.done.set()


def _send_pipeline(client: Any, batch: list[_Call]) -> None:
    pipe = client.pipeline(transaction=False)
    for each in batch:
        pipe.execute_command(*each.command)
    for each, reply in zip(batch, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception):
            each.error = reply
        else:
            each.reply = reply


def _outcome(call: _Call) -> Any:
    if call.error is not None:
        raise call.error
    return call.reply
