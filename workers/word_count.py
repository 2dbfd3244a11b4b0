"""A worker that counts words in the records of a topic, as one member of a consumer group.

Run several copies against the same Redis and they share the topic's partitions; kill one and
its partitions move to the others after its session timeout, from the offsets it committed
(committed with generation fencing, so a zombie cannot move them back): its counts, kept in
memory only, go with it, and the others count the records after those offsets. Stop one with
SIGTERM (``docker stop``, ``kill``) or Ctrl-C and it commits, leaves the group at once (its
partitions move without waiting for its session to pass) and prints its summary, as a Kafka
consumer closed from a shutdown hook does.

    python workers/word_count.py --redis-url redis://127.0.0.1:6379/0 --topic lines --group counters

Also the example of the client API: a ``Consumer`` with a rebalance listener that commits before
its partitions go, and prints what it gained and lost. ``--max-records`` makes it stop by itself.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rcoord import Consumer, ConsumerGroupConfig, ConsumerRebalanceListener, TopicPartition
from rcoord.cli import ENV_REDIS_URL, Parser, UsageError, check_url, env_default
from rcoord.client import WakeupError
from rcoord.ops.common import integer, nonnegative_seconds


def _records(text: str) -> int:
    """An argparse ``type``: a number of records, 0 for no limit (a negative one stopped the
    worker before it read a record, without a word)."""
    records = integer(text)  # (digits and a sign, as every rcoord command reads a number)
    if records < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of records >= 0 (0: never stop)")
    return records


class Announce(ConsumerRebalanceListener):
    """Kafka's listener contract: revoked (commit there) before assigned; lost means no commit."""

    def __init__(self, consumer_ref: list[Consumer]) -> None:
        self._consumer = consumer_ref
        self.joined = False  # a generation assigned this member its partitions (maybe none)

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._consumer[0].commit()
        print(f"revoked  {sorted(p.partition for p in partitions)}", flush=True)

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self.joined = True
        print(f"assigned {sorted(p.partition for p in partitions)}", flush=True)

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        print(f"lost     {sorted(p.partition for p in partitions)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    # rcoord's parser: a bad flag is one line naming it, exit 2, as the rcoord commands say it.
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url", default=env_default(ENV_REDIS_URL),
                    help=f"Redis or Redis Cluster (default ${ENV_REDIS_URL})")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", default="word-count")
    ap.add_argument("--namespace", default=env_default("RCOORD_NAMESPACE", "rcoord"),
                    help="the rcoord namespace (default $RCOORD_NAMESPACE, else rcoord)")
    ap.add_argument("--max-records", type=_records, default=0,
                    help="stop after this many (0: never)")
    # (a negative one stopped the worker at its first empty poll; 'nan' never stopped it;
    # "1_0" was 10)
    ap.add_argument("--idle-exit-s", type=nonnegative_seconds("never stop"), default=0.0,
                    help="stop after this long holding partitions with no records (the time "
                    "spent joining the group does not count; 0: never)")
    args = ap.parse_args(argv)
    try:
        check_url(args.redis_url)  # (an http:// URL ended the worker in a traceback)
    except UsageError as exc:
        ap.error(str(exc))

    config = ConsumerGroupConfig(
        group_id=args.group, topics=[args.topic], redis_url=args.redis_url, namespace=args.namespace,
        session_timeout_ms=6000, heartbeat_interval_ms=1000, rebalance_timeout_ms=10_000,
    )
    ref: list[Consumer] = []
    listener = Announce(ref)
    consumer = Consumer(config, listener=listener, auto_commit_interval_ms=1000)
    ref.append(consumer)
    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        # The loop's own thread commits and closes: wakeup() makes its poll() raise. As PID 1
        # in a container a process ignores SIGTERM unless it handles it, and `docker stop`
        # then kills it 10 s later, still a member of the group for a session timeout.
        if not stopping:
            stopping.append(signum)
            consumer.wakeup()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    words: collections.Counter[str] = collections.Counter()
    seen = 0
    idle_since: float | None = None  # when this idle stretch, holding partitions, began
    try:
        while not stopping and (not args.max_records or seen < args.max_records):
            try:
                # (at most what --max-records leaves: whole polls were counted and committed,
                # the records past N with them)
                records = consumer.poll(timeout=0.5, max_records=(
                    args.max_records - seen if args.max_records else None))
            except WakeupError:
                break
            if not records:
                if not consumer.assignment():
                    # Joining (the first rebalance waits 3 s by default) or between
                    # generations: nothing could have been read, so this is not idleness.
                    idle_since = None
                    continue
                now = time.monotonic()
                idle_since = now if idle_since is None else idle_since
                if args.idle_exit_s and now - idle_since >= args.idle_exit_s:
                    break
                continue
            idle_since = None
            for r in records:
                words.update((r.value or b"").decode("utf-8", "replace").split())
                seen += 1
        try:
            consumer.commit()
        except WakeupError:  # the signal came during this commit: it ended it; commit again
            consumer.commit()
    finally:
        consumer.close()
    print(f"records {seen}; top words {words.most_common(3)}", flush=True)
    if stopping:
        # Stopped while it could not join (Redis unreachable, say), it has nothing committed
        # and no membership: "committed and left" told the operator its progress was safe.
        done = ("committed and left the group" if listener.joined
                else "it never joined the group and committed nothing")
        print(f"stopped by {signal.Signals(stopping[0]).name}; {done}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
