"""Concurrent commands of one blocking coordinator's threads, sent together in one pipeline.

A process that hosts many members of a group (worker threads, a Spark executor's tasks) sends
their JoinGroups and SyncGroups within a few ms of each other: when the initial delay ends, when
the leader's assignment arrives. Sent one by one, each costs the process a connection checkout,
a write, a blocking read and the GIL hand-overs around them, several times what the server spends
on it; on these machines a 250-thread process spent about 2 ms of CPU per member that way. Here a
thread that finds no batch in flight in its call's lane sends its command at once (alone, it is
the plain call); threads that come while a batch of their lane is in flight queue theirs, and the
first of them sends the lane's whole queue as one pipeline when that batch returns. Each thread
gets its own reply or error: a pipeline is not a transaction, and the commands are independent
(each is one atomic function call). Like ``rcoord.wake``, only the blocking driver uses this.

On a cluster each slot is a lane of its own (the slot of the command's first key: all keys of a
function call share it, so the calls of one group still go together), with its own queue and
its own batch in flight; a single node is one lane. Kafka's client likewise keeps its in-flight
requests per broker (``InFlightRequests``, a queue per node), so a coordinator broker that stops
answering delays only the requests sent to it: here a call stuck on a stalled master holds up
only the calls for its slot, and the members of groups on the healthy masters get their answers
(with one queue for all nodes, every thread's call waited behind the stuck batch, and their
members were expired). A lane is dropped once no batch of it is in flight, so the lanes kept
are only those in use. A batch that fails as a whole on a cluster (its master is down, or no
node serves its slot) is sent again call by call, so each caller gets the outcome of its own
call, as it would have alone.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis

from .forking import renew_after_fork

__all__ = ["SharedCalls"]


_UNSET: Any = object()

_SCRIPT_CALLS = frozenset({"FCALL", "FCALL_RO", "EVAL", "EVAL_RO", "EVALSHA", "EVALSHA_RO"})
"""Commands written ``name numkeys key...``: their first key is the fourth word."""


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
        # A lane is here only while a batch of it is in flight (or its sender is about to send
        # it), with the calls queued behind that batch.
        self._lanes: dict[int | None, list[_Call]] = {}
        self._pid = os.getpid()
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """A forked child starts with no queues and a new lock: the parent's queues are not
        its calls, and a lock a parent thread held at the fork (for a queue update) is never
        released in the child, whose first call waited for it for ever."""
        self._lock = threading.Lock()
        self._lanes, self._pid = {}, os.getpid()

    def execute(self, client: Any, command: tuple[Any, ...]) -> Any:
        """Send ``command`` (alone, or with the calls of its lane queued meanwhile) and return
        its reply; an error reply or a failed send is raised."""
        call = _Call(command)
        lane = _lane(client, command)
        with self._lock:
            if self._pid != os.getpid():  # a forked child (where no at-fork hook ran)
                self._lanes, self._pid = {}, os.getpid()
            queue = self._lanes.get(lane)
            if queue is None:
                self._lanes[lane] = [call]
                call.sends = True
            else:
                queue.append(call)
                call.done = threading.Event()
        if not call.sends:
            try:
                call.done.wait()  # type: ignore[union-attr]
            except BaseException:
                # Interrupted while waiting (a KeyboardInterrupt, a signal handler's
                # SystemExit): the turn to send may be, or become, this call's, and a turn
                # nobody takes would stall every later call of the lane.
                self._withdraw(call, lane)
                raise
        if call.sends:
            self._send_queue(client, lane)
        if call.alone:
            return client.execute_command(*command)
        return _outcome(call)

    def _withdraw(self, call: _Call, lane: int | None) -> None:
        """Take a call whose thread stopped waiting out of its lane's queue, unsent, and hand
        its turn to send (if it had come) to the next queued call. A call already taken into a
        batch is left to that batch's sender."""
        with self._lock:
            queue = self._lanes.get(lane, [])
            if not any(each is call for each in queue):
                return
            self._lanes[lane] = [each for each in queue if each is not call]
            if call.sends:
                self._pass_turn(lane)

    def _pass_turn(self, lane: int | None) -> None:
        """The first queued call of ``lane`` sends its next batch; none queued, no batch of it
        is in flight, and the lane is dropped (the caller holds the lock)."""
        queue = self._lanes.get(lane)
        if queue:
            queue[0].sends = True
            queue[0].done.set()  # type: ignore[union-attr]
        else:
            self._lanes.pop(lane, None)

    def queued(self) -> int:
        """How many calls wait for a batch in flight to return (for tests and debugging)."""
        with self._lock:
            return sum(len(queue) for queue in self._lanes.values())

    def _send_queue(self, client: Any, lane: int | None) -> None:
        with self._lock:
            batch, self._lanes[lane] = self._lanes[lane], []
        try:
            if len(batch) == 1:
                batch[0].reply = client.execute_command(*batch[0].command)
            else:
                _send_pipeline(client, batch)
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets it
            for each in batch:
                each.error = exc
            if len(batch) > 1 and hasattr(client, "get_node_from_key"):
                # redis-py fails a cluster pipeline as a whole when it cannot reach a node it
                # addresses (or finds no node for a slot). Each caller sends its own call again,
                # by itself, and gets that call's own outcome, as it would have alone (a group
                # step is safe to send again, and the caller would retry it anyway).
                for each in batch:
                    each.alone = True
        finally:
            with self._lock:
                self._pass_turn(lane)  # the first call queued meanwhile sends the next batch
            for each in batch:
                if each.reply is _UNSET and each.error is None:  # the sender was interrupted
                    each.error = redis.ConnectionError(
                        "the call was not sent: the thread sending its batch was interrupted")
                if each.done is not None:
                    each.done.set()




def _lane(client: Any, command: tuple[Any, ...]) -> int | None:
    """The lane of ``command``: on a cluster client, the slot of its first key (the first word
    after the name, or after ``numkeys`` for a function or script call); else, or with no key,
    the one lane ``None``. The lane only decides which calls wait for which: a first word that
    is no key (ECHO's) just picks some lane, and redis-py routes every command as before."""
    keyslot = getattr(client, "keyslot", None)
    if keyslot is None:
        return None
    if str(command[0]).upper() in _SCRIPT_CALLS:
        key = command[3] if int(command[2]) > 0 else None
    else:
        key = command[1] if len(command) > 1 else None
    return None if key is None else int(keyslot(key))


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
