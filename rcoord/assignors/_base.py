"""The assignor contract shared by every strategy: protocol names, rebalance protocols, inputs.

In the classic protocol the coordinator does not assign partitions; the group leader does, with
the strategy named by the protocol the group agreed on ("range", "roundrobin", ...). The
coordinator only stores the result. So an assignor must be a pure function of its inputs: every
leader (and every test) must compute the same answer, whatever order a dict happened to be
built in. Kafka's assignors sort members and partitions for the same reason; where Kafka walks a
hash map, rcoord walks sorted keys.

Common rules, as in Kafka's ``AbstractPartitionAssignor``:

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

from ..errors import InvalidRequestError, RcoordError
from ..protocol.consumer import ConsumerProtocolSubscription, _topic_partitions
from ..protocol.offsets import TopicPartition

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "PartitionRacks",
    "RebalanceProtocol",
    "UnknownAssignorError",
    "check_inputs",
    "check_partition_racks",
    "get_assignor",
    "java_order",
    "kafka_member_order",
    "rebalance_protocol",
    "register_assignor",
    "subscribed_known_topics",
    "supported_protocols",
    "use_rack_aware",
    "user_data_for",
]

PartitionRacks = Mapping[TopicPartition, frozenset[str]]
"""The racks holding a replica of each partition (a partition not listed has none known)."""


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
        without it, it supports EAGER only, as in Kafka. It may also define
        ``subscription_user_data(assigned, generation) -> bytes`` (see ``user_data_for``).
        """
        ...


def user_data_for(assignor: Any, assigned: Sequence[TopicPartition], generation: int) -> bytes:
    """The ``user_data`` a member sends for this assignor's protocol, given its last
    assignment and that generation (-1 before its first): Kafka's
    ``ConsumerPartitionAssignor.subscriptionUserData``, with the state Kafka's assignors keep
    from ``onAssignment`` passed in, so one assignor object serves every member."""
    method = getattr(assignor, "subscription_user_data", None)
    return bytes(method(assigned, generation)) if method is not None else b""


def supported_protocols(assignor: Any) -> tuple[RebalanceProtocol, ...]:
    """The rebalance protocols an assignor declares (EAGER when it declares none).

    Each entry may be a ``RebalanceProtocol`` or its value ("eager", "cooperative"), and comes
    back as the enum member: the client tests ``protocol is RebalanceProtocol.COOPERATIVE``,
    which a plain "cooperative" str fails, so such a member would silently behave eagerly (and
    its leader skip the KIP-429 check) while reporting "cooperative". Anything else (a method,
    as Kafka's ``supportedProtocols()``, or an unknown name) raises ``TypeError`` naming the
    assignor, instead of failing later with a message that does not say which.
    """
    declared = getattr(assignor, "supported_protocols", None)
    if not declared:
        return (RebalanceProtocol.EAGER,)
    name = getattr(assignor, "name", repr(assignor))
    valid = ", ".join(repr(p.value) for p in RebalanceProtocol)
    if isinstance(declared, (str, bytes)) or not isinstance(declared, Iterable):
        raise TypeError(f"assignor {name!r}: supported_protocols must be a tuple of "
                        f"RebalanceProtocol ({valid}), got {declared!r}")
    out = []
    for entry in declared:
        try:
            out.append(RebalanceProtocol(entry))
        except ValueError:
            raise TypeError(f"assignor {name!r}: supported_protocols holds {entry!r}, which is "
                            f"not a RebalanceProtocol ({valid})") from None
    return tuple(out)


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


def java_order(text: str) -> bytes:
    """Sort key: ``text`` as Java's ``String.compareTo`` orders it, by UTF-16 code units.

    Kafka's assignors sort member and instance ids that way. Python compares code points,
    which differs for ids mixing a character above U+FFFF (a surrogate pair, 0xD800-0xDFFF)
    with one in U+E000-U+FFFF: "😀-1" sorts after "Ａ-2" in Python and before it in Java."""
    return text.encode("utf-16-be", "surrogatepass")


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
    return [mid for mid, _ in sorted(
        pairs, key=lambda p: (p[1] is None, java_order(p[1] or ""), java_order(p[0])))]


def check_inputs(
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
        return sorted(members, key=java_order)
    if isinstance(member_order, str) or not isinstance(member_order, Sequence):
        raise TypeError("member_order must be a sequence of member ids")
    order = list(member_order)
    if len(order) != len(members) or set(order) != set(members):
        raise ValueError("member_order must list every member id exactly once")
    return order


def check_partition_racks(partition_racks: Any) -> dict[TopicPartition, frozenset[str]]:
    """Validate ``partition_racks`` and return it normalised (``{}`` for None).

    Each value is the set of racks holding a replica of the partition (KIP-881); a bare str
    would silently become its characters, so it is refused. A key is checked as a subscription's
    owned partitions are: one that names no partition (``("t", "0")``, a bytes topic, a
    negative partition) would match nothing and silently turn rack awareness off.
    """
    if partition_racks is None:
        return {}
    if not isinstance(partition_racks, Mapping):
        raise TypeError("partition_racks must map TopicPartition -> set of rack names")
    out: dict[TopicPartition, frozenset[str]] = {}
    for tp, racks in partition_racks.items():
        try:
            (key,) = _topic_partitions("partition_racks keys", (tp,))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"partition_racks key {tp!r} must be a TopicPartition(topic: str, "
                            f"partition: int >= 0): {exc}") from None
        if isinstance(racks, (str, bytes)) or not isinstance(racks, Iterable):
            raise TypeError(f"racks of {tp!r} must be a set of str, got {type(racks).__name__}")
        names = frozenset(racks)
        if not all(isinstance(r, str) for r in names):
            raise TypeError(f"racks of {tp!r} must be str")
        out[key] = names
    return out


def subscribed_known_topics(
    members: Mapping[str, ConsumerProtocolSubscription], partitions_per_topic: Mapping[str, int]
) -> list[str]:
    """Topics somebody subscribes to and the metadata knows, sorted (what gets assigned)."""
    subscribed = {t for sub in members.values() for t in sub.topics}
    return sorted(subscribed & partitions_per_topic.keys())


def use_rack_aware(
    consumer_racks: Iterable[str],
    partition_racks: Iterable[str],
    racks_per_partition: Iterable[frozenset[str]],
) -> bool:
    """Kafka's ``useRackAwareAssignment``: only when it can help.

    Members and partitions must share a rack, and not every partition may be on every rack
    (if all partitions sit on the same racks, every member is equally close to all of them and
    matching racks would only cost balance).
    """
    members_on = set(consumer_racks)
    all_racks = frozenset(partition_racks)
    if not members_on or members_on.isdisjoint(all_racks):
        return False
    return not all(racks == all_racks for racks in racks_per_partition)


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


