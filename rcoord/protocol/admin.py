"""Group administration results: DescribeGroups, ListGroups, DeleteGroups, OffsetDelete."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import Errors
from ._checks import check_count, check_id, optional_text, require_str, text
from .offsets import TopicPartition

__all__ = [
    "DESCRIBE_PAGE",
    "DESCRIBE_RESTARTS",
    "DescriptionPage",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "OffsetDeleteResult",
    "decode_description_page",
    "group_ids_arg",
    "states_filter",
]


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    """Kafka's DescribedGroup. An unknown group describes as "Dead" with no members.

    ``protocol_name`` and the members' metadata and assignment are filled only while the group
    is Stable, as Kafka does.

    ``incarnation`` (not Kafka's) tells this group from one deleted and made again under its
    id, whose generations start over: an opaque token written once when the group record is
    made, not repeated by separate calls (its creation's millisecond, and Redis ``TIME``'s
    microseconds, as a group can be made again within one millisecond; the calls of one
    MULTI/EXEC share one ``TIME``, so a group deleted and made again inside a hand-made
    transaction, which rcoord never sends, keeps its token). A group an older rcoord made has
    its creation's millisecond alone; an unknown group has "". Compare tokens for equality only.
    """

    error: Errors
    group_id: str
    state: str
    protocol_type: str = ""
    protocol_name: str = ""
    members: list[MemberDescription] = field(default_factory=list)
    incarnation: str = ""


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True)
class OffsetDeleteResult:
    error: Errors
    partitions: dict[TopicPartition, Errors] = field(default_factory=dict)


DESCRIBE_PAGE = 250
"""Members listed per ``describe_group`` call (lua/describe_group.lua): at most 4.6 ms of server
time each in ``bench/leave_batch.py``; 1,000 in one call held the shard 7-9 ms."""
DESCRIBE_RESTARTS = 3
"""Times a paged description starts again because the group changed between its pages; the
last try lists the group in one call."""


@dataclass(frozen=True)
class DescriptionPage:
    """One page of a description (lua/describe_group.lua): the description with this page's
    members, how many members the group has in all, where the next page starts, and the token
    every page of one consistent description shares."""

    description: GroupDescription
    total: int
    next: int
    token: bytes


def decode_description_page(group_id: str, blob: bytes) -> DescriptionPage:
    rep: dict[bytes, Any] = msgpack.unpackb(blob, raw=True)
    description = GroupDescription(
        error=Errors.NONE,
        group_id=group_id,
        state=text(rep[b"st"]),
        protocol_type=text(rep.get(b"pt")),
        protocol_name=text(rep.get(b"pn")),
        members=[
            MemberDescription(
                member_id=text(m[b"id"]),
                group_instance_id=optional_text(m[b"iid"]),
                client_id=text(m[b"cid"]),
                client_host=text(m[b"host"]),
                metadata=bytes(m[b"meta"] or b""),
                assignment=bytes(m[b"asg"] or b""),
            )
            for m in (rep.get(b"mem") or [])
        ],
        incarnation=text(rep.get(b"inc")),
    )
    total = int(rep.get(b"n") or 0)
    return DescriptionPage(description, total, int(rep.get(b"nx") or total),
                           bytes(rep.get(b"tok") or b""))


def group_ids_arg(group_ids: Iterable[Any]) -> list[str]:
    """The checked ids of a DeleteGroups call, duplicates dropped.

    Each group is deleted by its own script call, so a long list never holds the server for
    long: like Kafka, which accepts any number, the list has no bound of its own. The empty
    group id is accepted, as Kafka does "for backwards compatibility".
    """
    if isinstance(group_ids, (str, bytes)):
        raise TypeError("group_ids must be a sequence of str, not one str")
    return list(dict.fromkeys(check_id("group_id", g) for g in group_ids))


def states_filter(states: Iterable[Any] | None) -> set[str] | None:
    """ListGroups' state filter, lower-cased; at most MAX_ITEMS_PER_CALL names. None or an
    empty sequence: every group, as Kafka's ListGroups ``StatesFilter`` ("if empty, all groups
    are returned"); an empty set matched none, so ``list_groups([])`` answered no groups."""
    if states is None:
        return None
    if isinstance(states, (str, bytes)):
        raise TypeError("states must be a sequence of state names, not one str")
    names = list(states)
    check_count("states", names)
    return {require_str("state", s).strip().lower() for s in names} or None
