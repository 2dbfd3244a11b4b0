"""Partition assignors: the leader's pure, deterministic strategies for dividing partitions.

In the classic protocol the coordinator does not assign partitions; the group leader does, with
the strategy named by the protocol the group agreed on ("range", "roundrobin", ...). The
coordinator only stores the result. So an assignor must be a pure function of its inputs: every
leader (and every test) must compute the same answer, whatever order a dict happened to be
built in. Kafka's assignors sort members and partitions for the same reason.

Both built-in assignors follow Kafka's semantics (``RangeAssignor`` and ``RoundRobinAssignor``,
without rack awareness). Common rules, as in Kafka's ``AbstractPartitionAssignor``:

* every member appears in the result, possibly with an empty list;
* a topic nobody subscribes to is not assigned;
* a subscribed topic missing from ``partitions_per_topic`` (unknown to the cluster metadata) is
  skipped rather than failing the whole rebalance.

Members are ordered by member id, or by an explicit ``member_order``. Kafka orders static members
(KIP-345) first, by group instance id, so that a restarted static member, which gets a fresh
member id, keeps its partitions; ``kafka_member_order`` builds that order from the leader's
JoinGroup member list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from types import MappingProxyType
from typing import Any, Protocol

from .errors import InvalidRequestError, RcoordError
from .protocol.consumer import ConsumerProtocolSubscription
from .protocol.offsets import TopicPartition

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "RangeAssignor",
    "RebalanceProtocol",
    "RoundRobinAssignor",
    "UnknownAssignorError",
    "get_assignor",
    "kafka_member_order",
    "rebalance_protocol",
    "register_assignor",
]


class RebalanceProtocol(str, Enum):
    """How members give up partitions in a rebalance (Kafka's ``RebalanceProtocol``).

    EAGER: every member revokes everything before it rejoins. COOPERATIVE (KIP-429): a member
    keeps what it owns through the rebalance and revokes only what the new assignment takes
    away; the group rejoins once more to hand those partitions to their new owners. Declared
    in order of strength: a consumer uses the strongest protocol all its assignors support.
    """

    EAGER = "eager"
    COOPERATIVE = "cooperative"


class Assignor(Protocol):
    """A named assignment strategy. ``name`` is the protocol name members offer in JoinGroup."""

    name: str

    def assign(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        partitions_per_topic: Mapping[str, int],
    ) -> dict[str, list[TopicPartition]]:
        """Map every member id to its partitions; must be deterministic.

        Built-in assignors also take keyword arguments ``member_order`` (see
        ``kafka_member_order``) and ``partition_racks`` (``{TopicPartition: set of racks}``).
        An assignor may declare ``supported_protocols`` (a tuple of ``RebalanceProtocol``);
        without it, it supports EAGER only, as in Kafka.
        """
        ...


def supported_protocols(assignor: Any) -> tuple[RebalanceProtocol, ...]:
    """The rebalance protocols an assignor declares (EAGER when it declares none)."""
    declared = getattr(assignor, "supported_protocols", None)
    return tuple(declared) if declared else (RebalanceProtocol.EAGER,)


def rebalance_protocol(assignors: Iterable[Any]) -> RebalanceProtocol:
    """The protocol a consumer with these assignors uses: the strongest they all support.

    As Kafka's ConsumerCoordinator: listing "cooperative-sticky" with "range" gives EAGER,
    which is the first step of the rolling upgrade from eager to cooperative (the second step
    drops "range").
    """
    common: set[RebalanceProtocol] | None = None
    names = []
    for a in assignors:
        names.append(getattr(a, "name", repr(a)))
        common = set(supported_protocols(a)) if common is None else common & set(
            supported_protocols(a))
    if not common:
        raise ValueError(f"assignors {names} have no rebalance protocol in common")
    order = list(RebalanceProtocol)
    return max(common, key=order.index)


class UnknownAssignorError(RcoordError, KeyError):
    """No assignor is registered under the name (a ``KeyError``, so ``except KeyError`` works)."""

    def __str__(self) -> str:
        # KeyError's own __str__ shows repr(message), quotes and all.
        return str(self.args[0]) if self.args else ""


def kafka_member_order(members: Iterable[tuple[str, str | None]]) -> list[str]:
    """Member ids in Kafka's assignor order: static members by instance id, then dynamic by id.

    ``members`` holds ``(member_id, group_instance_id)`` pairs, e.g. from the leader's
    ``JoinGroupResult.members``. Static members come first because their instance id survives a
    restart while their member id does not, so ordering by it keeps their assignment stable.

    ==========  ===========  =====
    member id   instance id  order
    ==========  ===========  =====
    a-1         None         3
    b-7         "zeta"       2
    c-2         "alpha"      1
    ==========  ===========  =====
    """
    pairs = list(members)
    return [mid for mid, _ in sorted(pairs, key=lambda p: (p[1] is None, p[1] or "", p[0]))]


def _check_inputs(
    members: Any, partitions_per_topic: Any, member_order: Sequence[str] | None
) -> list[str]:
    """Validate the inputs and return the member ids in assignment order."""
    if not isinstance(members, Mapping):
        raise TypeError("members must map member id -> ConsumerProtocolSubscription")
    for mid, sub in members.items():
        if not isinstance(mid, str):
            raise TypeError(f"member ids must be str, got {type(mid).__name__}")
        if not isinstance(sub, ConsumerProtocolSubscription):
            raise TypeError(
                f"subscription of {mid!r} must be a ConsumerProtocolSubscription, "
                f"got {type(sub).__name__}"
            )
    if not isinstance(partitions_per_topic, Mapping):
        raise TypeError("partitions_per_topic must map topic -> partition count")
    for topic, count in partitions_per_topic.items():
        if not isinstance(topic, str):
            raise TypeError(f"topics must be str, got {type(topic).__name__}")
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"partition count of {topic!r} must be an int")
        if count < 0:
            raise InvalidRequestError(f"partition count of {topic!r} must be >= 0, got {count}")
    if member_order is None:
        return sorted(members)
    if isinstance(member_order, str) or not isinstance(member_order, Sequence):
        raise TypeError("member_order must be a sequence of member ids")
    order = list(member_order)
    if len(order) != len(members) or set(order) != set(members):
        raise ValueError("member_order must list every member id exactly once")
    return order


class RangeAssignor:
    """Kafka's RangeAssignor: per topic, contiguous ranges; the first ``n % m`` get one extra.

    For each topic (in name order) the members subscribed to it, in member order, split its
    ``n`` partitions into ``m`` contiguous ranges of ``n // m``; the first ``n % m`` members get
    one more. Ranges keep a member's partitions of co-partitioned topics aligned (partition 0 of
    every topic goes to the same member), which joins across topics rely on. The cost is skew:
    the extra partitions of every topic go to the same first members.

    Members C0 and C1 subscribe to t0 and t1, each with 3 partitions:

    ======  ==========================
    member  assignment
    ======  ==========================
    C0      t0p0, t0p1, t1p0, t1p1
    C1      t0p2, t1p2
    ======  ==========================
    """

    name = "range"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def assign(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        member_order: Sequence[str] | None = None,
        partition_racks: Mapping[TopicPartition, Any] | None = None,
    ) -> dict[str, list[TopicPartition]]:
        order = _check_inputs(members, partitions_per_topic, member_order)
        result: dict[str, list[TopicPartition]] = {mid: [] for mid in order}
        subscribed = {t for sub in members.values() for t in sub.topics}
        for topic in sorted(subscribed & partitions_per_topic.keys()):
            consumers = [mid for mid in order if topic in members[mid].topics]
            count = partitions_per_topic[topic]
            per, extra = divmod(count, len(consumers))
            start = 0
            for i, mid in enumerate(consumers):
                length = per + (1 if i < extra else 0)
                result[mid].extend(TopicPartition(topic, p) for p in range(start, start + length))
                start += length
        return result


class RoundRobinAssignor:
    """Kafka's RoundRobinAssignor: all partitions dealt in turn, skipping unsubscribed members.

    Every partition of every subscribed topic, sorted by (topic, partition), goes to the next
    member in a circular walk over the members in member order; a member not subscribed to the
    partition's topic is passed over (the walk does not restart per topic). With identical
    subscriptions this balances total counts to within one, across all topics, which ranges
    cannot do.

    Members C0 and C1 subscribe to t0 and t1, each with 3 partitions:

    ======  ==========================
    member  assignment
    ======  ==========================
    C0      t0p0, t0p2, t1p1
    C1      t0p1, t1p0, t1p2
    ======  ==========================
    """

    name = "roundrobin"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def assign(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        member_order: Sequence[str] | None = None,
        partition_racks: Mapping[TopicPartition, Any] | None = None,
    ) -> dict[str, list[TopicPartition]]:
        order = _check_inputs(members, partitions_per_topic, member_order)
        result: dict[str, list[TopicPartition]] = {mid: [] for mid in order}
        subscribed = {t for sub in members.values() for t in sub.topics}
        pos = 0  # the circular iterator's position, kept across topics as in Kafka
        for topic in sorted(subscribed & partitions_per_topic.keys()):
            for p in range(partitions_per_topic[topic]):
                # Someone subscribes to this topic, so the walk finds a member within one lap.
                while topic not in members[order[pos]].topics:
                    pos = (pos + 1) % len(order)
                result[order[pos]].append(TopicPartition(topic, p))
                pos = (pos + 1) % len(order)
        return result


_REGISTRY: dict[str, Assignor] = {}

ASSIGNORS: Mapping[str, Assignor] = MappingProxyType(_REGISTRY)
"""The registered assignors by name (read-only; change it with ``register_assignor``)."""


def register_assignor(assignor: Assignor, *, replace: bool = False) -> None:
    """Make ``assignor`` available to ``get_assignor`` under its ``name``.

    Taking a registered name needs ``replace=True``, so a plug-in cannot silently change what
    "range" means for every group in the process.
    """
    name = getattr(assignor, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError("an assignor needs a non-empty str 'name'")
    if not callable(getattr(assignor, "assign", None)):
        raise TypeError(f"assignor {name!r} has no assign() method")
    if name in _REGISTRY and _REGISTRY[name] is not assignor and not replace:
        raise ValueError(f"an assignor named {name!r} is already registered (use replace=True)")
    _REGISTRY[name] = assignor


def get_assignor(name: str) -> Assignor:
    """The assignor registered under ``name`` (the protocol name the group chose)."""
    if not isinstance(name, str):
        raise TypeError(f"assignor name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownAssignorError(f"unknown assignor {name!r}; known: {known}") from None


register_assignor(RangeAssignor())
register_assignor(RoundRobinAssignor())
