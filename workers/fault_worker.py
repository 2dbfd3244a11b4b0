"""One consumer-group member for the fault suite (tests/test_faults.py), as its own process.

It consumes a topic with ``Consumer`` and writes its history to a local file, one JSON object a
line, so the history survives whatever happens to Redis (a restart without persistence loses
everything stored there)::

    {"e": "assigned" | "revoked" | "lost", "t": ..., "gen": ..., "member": ..., "parts": [...]}
    {"e": "processed", "t": ..., "values": [...], "parts": [...]}  # before the commit below
    {"e": "commit", "t": ..., "sent": ..., "gen": ..., "member": ..., "offsets": {...}}
    {"e": "commit_refused" | "commit_failed", "t": ..., "gen": ..., "member": ..., "error": ...}
    {"e": "exit", "t": ..., "num_partitions": ...}      # the layout this process ended on

Offsets are committed by hand (auto-commit off) after every processed batch, so every commit
that succeeded is in the file (Kafka's ``commitSync`` after processing: at-least-once).
SIGTERM closes the consumer (revoke, leave) and exits; SIGKILL and SIGSTOP are the faults.

    python workers/fault_worker.py --redis-url URL --namespace NS --group G --topic T \
        --name w1 --history w1.jsonl [--session-timeout-ms 10000 --heartbeat-interval-ms 300] \
        [--group-instance-id ID]

The fault suite passes a session of 1-2 s and lowers its namespace's
``group_min_session_timeout_ms`` to match; a fresh namespace takes Kafka's 6 s at least. A join
refused for good (that session out of range, say) ends the worker with exit status 2 and the
setting to change, as Kafka's ``poll()`` raises such a refusal as fatal.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from typing import Any


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--history", required=True, help="file to append the history to")
    p.add_argument("--session-timeout-ms", type=int, default=10000)
    p.add_argument("--heartbeat-interval-ms", type=int, default=300)
    p.add_argument("--rebalance-timeout-ms", type=int, default=4000)
    p.add_argument("--group-instance-id", default=None, help="a static member (KIP-345)")
    p.add_argument("--assignor", action="append", default=None,
                   help="assignor name, repeatable, most preferred first (default: range, "
                        "roundrobin)")
    args = p.parse_args()

    from rcoord.client import (
        CommitFailedError,
        Consumer,
        ConsumerGroupConfig,
        JoinRefusedError,
        client_from_url,
    )
    from rcoord.errors import RcoordError
    from rcoord.protocol.offsets import TopicPartition

    logging.basicConfig(level=logging.WARNING, format=f"{args.name} %(levelname)s %(message)s")
    log = logging.getLogger("fault_worker")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(args.history, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - whole run

    def note(event: str, **fields: Any) -> None:
        out.write(json.dumps({"e": event, "t": time.time(), **fields}) + "\n")

    consumer: Any = None

    def ids() -> dict[str, Any]:
        gen = consumer.generation if consumer is not None else None
        return {"gen": gen.generation_id if gen else -1, "member": gen.member_id if gen else ""}

    class Listener:
        def on_partitions_assigned(self, parts: list[TopicPartition]) -> None:
            note("assigned", parts=sorted(tp.partition for tp in parts), **ids())

        def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
            note("revoked", parts=sorted(tp.partition for tp in parts), **ids())

        def on_partitions_lost(self, parts: list[TopicPartition]) -> None:
            note("lost", parts=sorted(tp.partition for tp in parts), **ids())

    client = client_from_url(args.redis_url)
    config = ConsumerGroupConfig(
        group_id=args.group,
        topics=[args.topic],
        redis_client=client,
        namespace=args.namespace,
        client_id=args.name,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        rebalance_timeout_ms=args.rebalance_timeout_ms,
        group_instance_id=args.group_instance_id,
        partition_watch_interval_ms=500,
        join_backoff_ms=200,
        retry_backoff_ms=50,
        retry_backoff_max_ms=300,
        **({"assignors": tuple(args.assignor)} if args.assignor else {}),
    )
    consumer = Consumer(config, listener=Listener(), enable_auto_commit=False,
                        max_poll_records=200, fetch_max_wait_ms=50)
    committed: dict[TopicPartition, int] = {}
    last_gen: Any = None
    while not stop.is_set():
        try:
            records = consumer.poll(timeout=0.2)
        except JoinRefusedError as exc:  # fatal: every later poll raises it again
            log.error("the group refused this member: %s%s", exc, f" ({exc.hint})" if exc.hint else "")
            consumer.close(timeout=1)
            out.close()
            client.close()
            return 2
        except Exception as exc:  # noqa: BLE001 - a join error is reported once; keep polling
            log.warning("poll: %s", exc)
            stop.wait(0.1)
            continue
        gen = consumer.generation
        if gen is not last_gen:
            committed, last_gen = dict(gen.committed) if gen else {}, gen
        if records:
            note("processed", values=[r.value.decode() for r in records if r.value is not None],
                 parts=sorted({r.partition for r in records}))
        if gen is None:
            continue
        changed = {}
        for tp in consumer.assignment():
            pos = consumer.position(tp)
            if committed.get(tp) != pos:
                changed[tp] = pos
        if not changed:
            continue
        # ``sent``: when the commit began. ``t`` is when its answer was written down, which a
        # SIGSTOP between the two puts after the process is woken, though Redis stored the
        # commit before the freeze (tests/test_chaos.py's fenced static member).
        stamp = {"gen": gen.generation_id, "member": gen.member_id, "sent": time.time()}
        try:
            consumer.commit(changed)
        except CommitFailedError as exc:
            note("commit_refused", error=exc.error.name, **stamp)
            continue
        except RcoordError as exc:
            note("commit_failed", error=type(exc).__name__, **stamp)
            continue
        committed.update(changed)
        note("commit", offsets={str(tp.partition): o for tp, o in changed.items()}, **stamp)
    try:
        consumer.close(timeout=10)
    except Exception as exc:  # noqa: BLE001 - the history says how it ended
        log.warning("close: %s", exc)
    num_partitions = consumer.group.coordinator.config.num_partitions
    note("exit", num_partitions=num_partitions)
    out.close()
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
