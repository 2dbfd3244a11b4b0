"""The compose demo's producer: creates the topic (once) and appends lines of words to it.

``docker compose --profile cluster up`` runs it beside the ``worker`` replicas
(workers/word_count.py), so the group has something to consume. It writes ``/tmp/ready`` once
the topic exists (the workers wait for that healthcheck), then appends ``--batch`` lines every
``--interval`` seconds; ``--records`` > 0 stops it after that many. A Redis error is printed
and retried after a pause (a failover, a restarted node), so it rides out the faults the
compose README suggests trying.

    python feed.py --redis-url redis://redis-1:6379/0 --topic lines --partitions 6
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from pathlib import Path

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "redis", "keeps", "the", "offsets"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--namespace", default="rcoord")
    ap.add_argument("--topic", default="lines")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--records", type=int, default=0, help="stop after this many (0: never)")
    ap.add_argument("--ready-file", default="/tmp/ready")
    args = ap.parse_args(argv)

    from rcoord.client import client_from_url
    from rcoord.errors import Errors, RcoordError
    from rcoord.topics import Producer, TopicError, Topics

    client = client_from_url(args.redis_url)
    try:
        Topics(client, args.namespace).create(args.topic, args.partitions)
        print(f"created topic {args.topic} with {args.partitions} partitions", flush=True)
    except TopicError as exc:
        if exc.error != Errors.TOPIC_ALREADY_EXISTS:
            raise
        print(f"topic {args.topic} exists", flush=True)
    Path(args.ready_file).write_text("ready\n")
    producer = Producer(client, args.namespace)
    rng = random.Random(7)
    sent = 0
    for n in itertools.count():
        if args.records and sent >= args.records:
            break
        size = min(args.batch, args.records - sent) if args.records else args.batch
        lines = [" ".join(rng.choices(WORDS, k=6)).encode() for _ in range(size)]
        try:
            producer.send_batch(args.topic, lines)
            sent += size
        except RcoordError as exc:
            print(f"send failed, retrying: {exc}", flush=True)
        if n % 30 == 0:
            print(f"sent {sent} lines", flush=True)
        time.sleep(args.interval)
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
