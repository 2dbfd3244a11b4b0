"""Helpers the benchmarks share: the server they run against, server-side counters, tables.

Every bench starts its own throw-away server on 127.0.0.1 (or takes ``--redis-url``, loopback
only), reads the server's own accounting (``INFO commandstats``, ``INFO cpu``, ``SLOWLOG``)
rather than timing calls from the client, and prints plain tables. Kept here once so the
figures in bench/README.md are measured the same way by every bench.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from rcoord.testing.embedded import EmbeddedServer  # noqa: E402

# Group steps are library functions (FCALL); topic steps and raw scripts may still be EVALSHA.
SCRIPT_COMMANDS = ("evalsha", "fcall", "fcall_ro")


def now() -> float:
    """CLOCK_MONOTONIC, system-wide on Linux, so times taken in different processes compare."""
    return time.monotonic()


def start_server(redis_url: str | None, extra_args: Sequence[str] = ()) -> tuple[
    EmbeddedServer | None, str, str, int
]:
    """``(server, url, host, port)``: an embedded server on a free 127.0.0.1 port (``server``
    is then the one to stop), or ``redis_url`` after checking that it is loopback."""
    if redis_url is None:
        server = EmbeddedServer(extra_args=list(extra_args)).start()
        return server, server.url, server.host, server.port
    parsed = redis.connection.parse_url(redis_url)
    host, port = parsed.get("host", "127.0.0.1"), int(parsed.get("port", 6379))
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("refusing to connect anywhere but 127.0.0.1")
    return None, f"redis://127.0.0.1:{port}/{parsed.get('db', 0)}", "127.0.0.1", port


def stats_of(stats: dict[str, Any], commands: Iterable[str] = SCRIPT_COMMANDS) -> tuple[int, int]:
    """(calls, usec) of ``commands`` in an ``INFO commandstats`` reply."""
    calls = usec = 0
    for name in commands:
        entry = stats.get(f"cmdstat_{name}") or {}
        calls += int(entry.get("calls", 0))
        usec += int(entry.get("usec", 0))
    return calls, usec


def script_stats(r: redis.Redis) -> tuple[int, int]:
    """(calls, usec) of script and function calls so far; subtract two readings for a delta."""
    return stats_of(r.info("commandstats"))


def rows_options(doc: str, calls: int) -> argparse.Namespace:
    """The options of a bench whose rows are calls timed by the server: ``-n`` calls per row
    and round (default ``calls``), ``--rounds`` (default 5), ``--redis-url``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=calls, help="calls per row and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--redis-url")
    return ap.parse_args()


def server_us_per_call(r: redis.Redis, cmd: Sequence[Any], n: int, batch: int) -> float:
    """Server µs per call of ``cmd`` (a script or function call) sent ``n`` times in pipelines
    of ``batch``: the ``INFO commandstats`` delta of the script commands over the calls."""
    c0, u0 = script_stats(r)
    for _ in range(n // batch):
        pipe = r.pipeline(transaction=False)
        for _ in range(batch):
            pipe.execute_command(*cmd)
        pipe.execute()
    c1, u1 = script_stats(r)
    return (u1 - u0) / max(c1 - c0, 1)


def server_cpu_s(r: redis.Redis) -> float:
    """CPU (user + sys) the server process has used so far (``INFO cpu``)."""
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def slowlog_last_id(r: redis.Redis) -> int:
    """The id of the newest SLOWLOG entry (-1 if none): pass it to ``slowest_since``."""
    entries = r.slowlog_get(1)
    return int(entries[0]["id"]) if entries else -1


def slowest_since(r: redis.Redis, last_id: int, depth: int = 128) -> float | None:
    """Longest command (ms) logged in SLOWLOG after entry ``last_id``; None if none."""
    worst = None
    for e in r.slowlog_get(depth):
        if int(e["id"]) > last_id:
            ms = int(e["duration"]) / 1000.0
            worst = ms if worst is None else max(worst, ms)
    return worst


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def print_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> None:
    """A plain-text table; columns in ``right`` (default: all but the first) align right."""
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        out = []
        for k, (c, w) in enumerate(zip(cells, widths)):
            out.append(str(c).rjust(w) if k in right else str(c).ljust(w))
        return "  ".join(out).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def server_label(info: dict[str, Any]) -> str:
    """``valkey 8.1.8`` or ``redis 7.4.1`` from ``INFO server``: Valkey also reports a
    ``redis_version`` (the Redis version it is compatible with, 7.2.4), which alone would name
    the same server two ways in one run's tables."""
    if info.get("valkey_version"):
        return f"{info.get('server_name') or 'valkey'} {info['valkey_version']}"
    return f"redis {info.get('redis_version', '?')}"


def machine_line() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} vCPU {cpu}".strip()


class NamespaceRegistry:
    """Hands out unique namespaces (``bench-<pid>-<time>-<n>``) and deletes their keys at the
    end, so a bench touches nothing else on an existing server."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self._n = 0

    def new(self) -> str:
        self._n += 1
        ns = f"bench-{os.getpid()}-{int(time.time())}-{self._n}"
        self.created.append(ns)
        return ns

    def delete(self, r: redis.Redis, ns: str) -> int:
        deleted = 0
        batch: list[bytes] = []
        for key in r.scan_iter(match=f"{ns}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += r.delete(*batch)
                batch = []
        if batch:
            deleted += r.delete(*batch)
        return deleted

    def delete_all(self, r: redis.Redis) -> None:
        for ns in self.created:
            try:
                self.delete(r, ns)
            except redis.RedisError:
                pass
