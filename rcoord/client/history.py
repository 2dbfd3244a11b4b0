"""RebalanceHistory: a listener that records every rebalance callback of a worker in Redis.

Demos, end-to-end tests and benchmarks run workers as separate processes and must check,
afterwards and across processes, which member held which partitions in which generation (for
example that no two members of one generation ever held the same partition). Each callback is
appended to one Redis list as a JSON object::

    {"event": "assigned"|"revoked"|"lost", "worker": ..., "pid": ..., "gen": ..., "member": ...,
     "partitions": [...], "held": [...], "reason": ...}

``partitions`` is what the callback was given; ``held`` is everything the member holds after
it. They differ under the cooperative protocol, where ``assigned`` lists only what was added.

plus whatever ``extra()`` returns (a benchmark adds its timestamps).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ..protocol.offsets import TopicPartition
from .consumer import ConsumerRebalanceListener

__all__ = ["RebalanceHistory"]


class RebalanceHistory(ConsumerRebalanceListener):
    def __init__(self, client: Any, key: str, worker: str, *,
                 extra: Callable[[], dict[str, Any]] | None = None) -> None:
        self._client = client
        self._key = key
        self._worker = worker
        self._extra = extra
        self.consumer: Any = None
        """The ``Consumer`` this listener belongs to (set once it exists): its generation is read."""

    def _note(self, event: str, partitions: list[TopicPartition]) -> None:
        gen = self.consumer.generation if self.consumer is not None else None
        item: dict[str, Any] = {
            "event": event,
            "worker": self._worker,
            "pid": os.getpid(),
            "gen": gen.generation_id if gen else -1,
            "member": gen.member_id if gen else "",
            "partitions": sorted(p.partition for p in partitions),
            "held": sorted(p.partition for p in self.consumer.assignment())
            if self.consumer is not None else [],
            "reason": gen.end_reason.value if gen is not None and gen.end_reason else None,
        }
        if self._extra is not None:
            item.update(self._extra())
        self._client.rpush(self._key, json.dumps(item))

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self._note("assigned", partitions)

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._note("revoked", partitions)

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        self._note("lost", partitions)
