"""JoinGroup: request checks and encoding, and the result type.

Possible errors in ``JoinGroupResult.error`` (Kafka's, same cases):
INVALID_GROUP_ID (empty group id), INVALID_SESSION_TIMEOUT (outside the namespace bounds),
UNKNOWN_MEMBER_ID (unknown member, or a member id for a group that does not exist),
MEMBER_ID_REQUIRED (KIP-394: rejoin with the ``member_id`` returned), INCONSISTENT_GROUP_PROTOCOL
(type differs, or no protocol in common), GROUP_MAX_SIZE_REACHED, FENCED_INSTANCE_ID (a newer
member holds this instance id), COORDINATOR_NOT_AVAILABLE (the group is being deleted),
UNKNOWN_SERVER_ERROR (a pending member sent an instance id).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import Errors, InvalidRequestError
from ._checks import (
    MAX_ID_BYTES,
    MAX_MEMBER_METADATA_BYTES,
    MAX_PROTOCOLS,
    check_count,
    check_id,
    check_instance_id,
    check_total,
    member_ref,
    optional_text,
    require_bytes,
    require_int32,
    require_str,
    text,
)
from .consumer import PROTOCOL_TYPE, subscribed_topics

__all__ = ["JoinGroupMember", "JoinGroupResult", "JoinRequest", "new_member_id"]


def new_member_id(client_id: str, group_instance_id: str, member_uuid: str) -> str:
    """The id a JoinGroup gives the new member it adds: Kafka's ``clientId-UUID``, or
    ``groupInstanceId-UUID`` for a static member.

    The request carries it (the UUID is the caller's), so that the same JoinGroup sent again
    names the member the first one may have added instead of adding a second, and so that a
    client knows its id before its first join returns (it can leave while that join is
    parked). The client id or instance id part is cut, at a character boundary, so that the
    id stays within ``MAX_ID_BYTES`` and the API accepts it back (an instance id may itself be
    ``MAX_ID_BYTES`` long, as a client id may).
    """
    room = MAX_ID_BYTES - 1 - len(member_uuid)
    prefix = (group_instance_id or client_id).encode()[:room].decode(errors="ignore")
    return f"{prefix}-{member_uuid}"


def _member_uuid(value: Any) -> str:
    """A new member's UUID in its canonical text form (36 characters)."""
    if value is None:
        return str(uuid.uuid4())
    if not isinstance(value, str):
        raise TypeError(f"new_member_uuid must be a str, got {type(value).__name__}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequestError(
            f"new_member_uuid {value!r} is not a UUID: pass str(uuid.uuid4()), or None"
        ) from None


@dataclass(frozen=True)
class JoinGroupMember:
    """One member as the leader sees it: id, instance id and metadata for the chosen protocol."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupResult:
    """Kafka's JoinGroupResponse. ``members`` is filled for the leader only."""

    error: Errors
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    member_id: str = ""
    members: list[JoinGroupMember] = field(default_factory=list)
    skip_assignment: bool = False

    @classmethod
    def failed(cls, error: Errors, member_id: str = "") -> JoinGroupResult:
        return cls(error=error, member_id=member_id)

    @classmethod
    def decode(cls, blob: bytes) -> JoinGroupResult:
        rep = msgpack.unpackb(blob, raw=True)
        error = Errors.from_name(rep[b"e"])
        members = [
            JoinGroupMember(
                member_id=text(m[b"id"]),
                group_instance_id=optional_text(m[b"iid"]),
                metadata=bytes(m[b"meta"]) if m[b"meta"] else b"",
            )
            for m in (rep.get(b"mem") or [])
        ]
        if error is not Errors.NONE:
            return cls(error=error, member_id=text(rep.get(b"mid")))
        return cls(
            error=error,
            generation_id=int(rep[b"gen"]),
            protocol_type=optional_text(rep.get(b"pt")),
            protocol_name=optional_text(rep.get(b"pn")),
            leader_id=text(rep.get(b"ldr")),
            member_id=text(rep.get(b"mid")),
            members=members,
            skip_assignment=bool(rep.get(b"skip")),
        )


@dataclass(frozen=True)
class JoinRequest:
    """A checked JoinGroup request, ready to become script arguments."""

    group_id: str
    member_id: str
    group_instance_id: str
    protocol_type: str
    protocols: bytes
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool
    reason: str | None
    subscriptions: bytes
    new_member_id: str
    supports_skip_assignment: bool = True

    @classmethod
    def build(
        cls,
        group_id: Any,
        member_id: Any,
        *,
        protocol_type: Any,
        protocols: Any,
        session_timeout_ms: Any,
        rebalance_timeout_ms: Any,
        group_instance_id: Any,
        client_id: Any,
        client_host: Any,
        require_known_member_id: Any,
        reason: Any,
        new_member_uuid: Any = None,
        supports_skip_assignment: Any = True,
    ) -> JoinRequest:
        """``new_member_uuid``: the UUID the id of a member this request adds is made from
        (``new_member_id``); None for a fresh one. A client sending its first JoinGroup again
        passes the one it sent before. ``supports_skip_assignment``: whether the client reads
        KIP-814's SkipAssignment (Kafka's JoinGroup v9+); one that does not is not told it
        leads when, a static leader back in a Stable group, it must not assign."""
        group_id = check_id("group_id", group_id)
        member_id = member_ref(member_id)
        protocol_type = check_id("protocol_type", protocol_type)
        session_timeout_ms = require_int32("session_timeout_ms", session_timeout_ms)
        if rebalance_timeout_ms is None:
            # JoinGroup v0's rule (Kafka's too). A session timeout that makes it < 1 is outside
            # the session bounds, which the join answers INVALID_SESSION_TIMEOUT, as Kafka.
            rebalance_timeout_ms = session_timeout_ms
        else:
            rebalance_timeout_ms = require_int32("rebalance_timeout_ms", rebalance_timeout_ms)
            if rebalance_timeout_ms < 1:
                raise InvalidRequestError(
                    f"rebalance_timeout_ms must be >= 1, got {rebalance_timeout_ms}")
        if isinstance(protocols, (str, bytes)) or not isinstance(protocols, Sequence):
            raise TypeError("protocols must be a sequence of (name, metadata bytes) pairs")
        check_count("protocols", protocols, MAX_PROTOCOLS)
        pairs: list[list[bytes]] = []
        seen: set[str] = set()
        total = 0
        for item in protocols:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise TypeError("each protocol must be a (name, metadata bytes) pair")
            name = check_id("protocol name", item[0])
            if name in seen:
                raise InvalidRequestError(f"protocol {name!r} is listed twice")
            seen.add(name)
            pair = [name.encode(), require_bytes(f"metadata of protocol {name!r}", item[1])]
            # What one member costs the group: stored with it, and sent to every leader.
            total += len(pair[0]) + len(pair[1])
            check_total("protocols (names and metadata)", total, MAX_MEMBER_METADATA_BYTES)
            pairs.append(pair)
        if reason is not None:
            reason = require_str("reason", reason)[:255]
        if not isinstance(require_known_member_id, bool):
            raise TypeError("require_known_member_id must be a bool")
        if not isinstance(supports_skip_assignment, bool):
            raise TypeError("supports_skip_assignment must be a bool")
        instance_id = check_instance_id(group_instance_id)
        client_id = check_id("client_id", client_id)
        return cls(
            group_id=group_id,
            member_id=member_id,
            group_instance_id=instance_id,
            protocol_type=protocol_type,
            protocols=msgpack.packb(pairs, use_bin_type=False),
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            client_id=client_id,
            client_host=check_id("client_host", client_host),
            require_known_member_id=require_known_member_id,
            reason=reason,
            subscriptions=_subscriptions(protocol_type, pairs),
            new_member_id=new_member_id(client_id, instance_id, _member_uuid(new_member_uuid)),
            supports_skip_assignment=supports_skip_assignment,
        )

    def args(self) -> list[Any]:
        """ARGV[3:] of join_group.lua."""
        return [
            self.member_id,
            self.group_instance_id,
            self.protocol_type,
            self.protocols,
            self.session_timeout_ms,
            self.rebalance_timeout_ms,
            self.client_id,
            self.client_host,
            "1" if self.require_known_member_id else "0",
            self.new_member_id,
            self.subscriptions,
            "1" if self.supports_skip_assignment else "0",
        ]


def _subscriptions(protocol_type: str, pairs: list[list[bytes]]) -> bytes:
    """For "consumer" members, the topics each protocol subscribes to (KIP-496, KIP-211).

    The coordinator needs them to keep subscribed offsets from expiring or being deleted; the
    decoder lives here, once, and the script stores what it found. Metadata that does not decode
    is marked ``False``, which counts as subscribed to every topic, as in Kafka.
    """
    out: list[list[Any]] = []
    if protocol_type == PROTOCOL_TYPE:
        for name, meta in pairs:
            topics = subscribed_topics(meta)
            out.append([name, False if topics is None else [t.encode() for t in sorted(topics)]])
    packed: bytes = msgpack.packb(out, use_bin_type=False)
    return packed
