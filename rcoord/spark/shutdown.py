"""How the stream reader's runner process ends: SIGTERM runs ``stop()``, and nothing cuts it short.

Spark (4.3) stops a query's *source runner* (``python_streaming_source_runner``, the Python
process that holds a group-mode member) from the JVM with ``PythonStreamingSourceRunner.stop()``:

1. ``PythonWorkerFactory.stopWorker(worker)``: ``Process.destroy()``, a SIGTERM, then it closes
   the socket;
2. ``PythonWorkerFactory.stop()``: ``Process.destroy()`` of every simple worker again, a
   **second** SIGTERM to the same process (Java sends it while the process is still alive).

Nothing follows: no SIGKILL, no wait. Measured with a probe source that logs every SIGTERM in
the runner: the second came 0.3 to 1.3 ms after the first, and in 3 of 4 stops it came after the
first had been handled, while ``stop()`` was running (the other time the two were delivered as
one).

Python's default SIGTERM action ends the process at once, skipping the runner's
``finally: reader.stop()``, so the member would stay in the group until its session timeout.
``install()`` makes the first SIGTERM raise ``SystemExit`` instead, which unwinds the runner's
loop into ``stop()``. That handler used to stay installed, so the second SIGTERM raised
``SystemExit`` again, inside ``stop()``: before ``ConsumerGroup.close()`` had begun, or while
the main thread waited there for the group's daemon thread to send LeaveGroup, which the
interpreter's shutdown could then cut off. Often LeaveGroup still got out; on a loaded machine
it sometimes did not and the member was removed by session expiry. Hence:

* the handler turns further SIGTERMs off before it raises (Spark's second SIGTERM is ignored);
* ``shielded()`` ignores SIGTERM while ``stop()`` leaves the group, whatever way the runner got
  there (a runner whose socket closed first reaches ``stop()`` through ``EOFError``).

``stop()`` stays bounded by the close timeout. Only the main thread can set signal handlers, and
only a process where ``install()`` ran is touched: a driver or test process that uses a reader
keeps its own SIGTERM handling.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["EXIT_CODE", "install", "shielded"]

EXIT_CODE = 128 + signal.SIGTERM
"""The status a shell reports for a SIGTERM death; the runner exits through SystemExit with it."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Ignore the SIGTERMs that follow (Spark sends two): stop() must run to its end.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(EXIT_CODE)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """Make a SIGTERM end this process through its ``finally`` blocks, once.

    A no-op outside the main thread (Python only lets the main thread set handlers).
    """
    if _main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def _ours(handler: object) -> bool:
    return handler is _on_sigterm or handler == signal.SIG_IGN


@contextmanager
def shielded() -> Iterator[None]:
    """Ignore SIGTERM inside the block if ``install()`` owns SIGTERM in this process.

    The handler in place before the block is restored after it.
    """
    if not _main_thread() or not _ours(signal.getsignal(signal.SIGTERM)):
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
