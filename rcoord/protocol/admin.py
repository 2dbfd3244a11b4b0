"""Group administration results: DescribeGroups, ListGroups, DeleteGroups, OffsetDelete."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import Errors
from ._checks import optional_text, text
from .offsets import TopicPartition

__all__ = [
    "MemberDescription",
    "GroupDescription",
    "GroupListing",
    "OffsetDeleteResult",
    "decode_description",
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
    """

    error: Errors
    group_id: str
    state: str
    protocol_type: str = ""
    protocol_name: str = ""
    members: list[MemberDescription] = field(default_factory=list)


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True)
class OffsetDeleteResult:
    error: Errors
    partitions: dict[TopicPartition, Errors] = field(default_factory=dict)


def decode_description(group_id: str, blob: bytes) -> GroupDescription:
    rep: dict[bytes, Any] = msgpack.unpackb(blob, raw=True)
    return GroupDescription(
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
    )
