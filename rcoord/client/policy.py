"""The client's error policy: what a member does when a coordinator call answers with an error.

``ERROR_POLICY`` is the one table (kafka-go's ``run()``, aiokafka's ``_do_heartbeat``);
``reaction_for`` looks an error up in it, and ``combine`` merges the rows of two errors that
ended the same generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from ..errors import (
    AuthenticationFailedError,
    ConnectionLost,
    Errors,
    ProtocolError,
    is_missing_permission,
)
from .errors import ReadOnlyReplicaError

__all__ = [
    "AUTHENTICATION_FAILED",
    "CONNECTION_LOST",
    "ERROR_POLICY",
    "MISSING_PERMISSION",
    "ON_A_REPLICA",
    "OTHERWISE",
    "Reaction",
    "combine",
    "outranks",
    "reaction_for",
]


@dataclass(frozen=True)
class Reaction:
    """What the member does when a coordinator call answers with an error (one table row)."""

    retry: bool
    """Retry the same call first (exponential back-off, for at most one session timeout)."""
    member_id: Literal["keep", "reset", "leave"]
    """Keep the member id, forget it (rejoin as a new member), or send LeaveGroup and forget it."""
    partitions: Literal["revoked", "lost"]
    """How the current generation's partitions end: revoked (commits may still succeed, so the
    consumer commits) or lost (another member may own them already: no commit)."""
    then: Literal["rejoin", "backoff", "fatal"]
    """Rejoin at once; or report the error through ``next()`` and rejoin after
    ``join_backoff_ms``; or report it and close the group."""

    @property
    def lost(self) -> bool:
        return self.partitions == "lost"

    @property
    def fatal(self) -> bool:
        """The group closes on the error: no later generation comes (whoever waits for one,
        a worker's ``next()`` or a Spark query, fails with it)."""
        return self.then == "fatal"


_UNREACHABLE = Reaction(True, "keep", "lost", "backoff")
_REFUSED = Reaction(False, "leave", "lost", "fatal")

ERROR_POLICY: Mapping[Errors, Reaction] = MappingProxyType(
    {
        # error                                retry  member id  partitions  then
        Errors.REBALANCE_IN_PROGRESS: Reaction(False, "keep", "revoked", "rejoin"),
        Errors.ILLEGAL_GENERATION: Reaction(False, "keep", "lost", "rejoin"),
        Errors.UNKNOWN_MEMBER_ID: Reaction(False, "reset", "lost", "rejoin"),
        Errors.GROUP_ID_NOT_FOUND: Reaction(False, "reset", "lost", "rejoin"),
        Errors.FENCED_INSTANCE_ID: Reaction(False, "keep", "lost", "fatal"),
        Errors.COORDINATOR_NOT_AVAILABLE: _UNREACHABLE,
        Errors.COORDINATOR_LOAD_IN_PROGRESS: _UNREACHABLE,
        Errors.NOT_COORDINATOR: _UNREACHABLE,
        Errors.REQUEST_TIMED_OUT: _UNREACHABLE,
        Errors.INVALID_SESSION_TIMEOUT: _REFUSED,
        Errors.INCONSISTENT_GROUP_PROTOCOL: _REFUSED,
        Errors.INVALID_GROUP_ID: _REFUSED,
        Errors.GROUP_AUTHORIZATION_FAILED: _REFUSED,
        Errors.GROUP_MAX_SIZE_REACHED: Reaction(False, "reset", "lost", "fatal"),
    }
)
"""The client's error policy, in one place. It applies to every call that carries a generation
or a member id: JoinGroup, SyncGroup, Heartbeat and OffsetCommit.

=================================  =====  =========  ==========  =======
error                              retry  member id  partitions  then
=================================  =====  =========  ==========  =======
REBALANCE_IN_PROGRESS              no     keep       revoked     rejoin
ILLEGAL_GENERATION                 no     keep       lost        rejoin
UNKNOWN_MEMBER_ID                  no     reset      lost        rejoin
GROUP_ID_NOT_FOUND                 no     reset      lost        rejoin
FENCED_INSTANCE_ID                 no     keep       lost        fatal
COORDINATOR_NOT_AVAILABLE,         yes    keep       lost        backoff
NOT_COORDINATOR,
COORDINATOR_LOAD_IN_PROGRESS,
REQUEST_TIMED_OUT
``ConnectionLost`` (exception)     yes    keep       lost        backoff
INVALID_SESSION_TIMEOUT,           no     leave      lost        fatal
INCONSISTENT_GROUP_PROTOCOL,
INVALID_GROUP_ID,
GROUP_AUTHORIZATION_FAILED
GROUP_MAX_SIZE_REACHED             no     reset      lost        fatal
a missing permission (exception)   no     leave      lost        fatal
a refused login (exception)        no     leave      lost        fatal
anything else                      no     leave      lost        backoff
=================================  =====  =========  ==========  =======

Why each row, in Kafka's terms: REBALANCE_IN_PROGRESS means "rejoin"; the member is still in the
group, so its partitions are *revoked* and a final commit still succeeds (the coordinator accepts
commits of the current generation while it prepares the rebalance), and the heartbeat keeps
beating until the revocation is done. ILLEGAL_GENERATION means the group went on without this
generation; Kafka resets the generation but keeps the member id. UNKNOWN_MEMBER_ID means the
member was removed (session expired, rebalance timeout, or left); it rejoins with a fresh id.
GROUP_ID_NOT_FOUND (a commit's answer once the group was deleted: its members expired and it was
deleted, or its offsets expired) means the same, the group gone with the member; Kafka's classic
member is told ILLEGAL_GENERATION there.
Both lose the partitions: someone else may be processing them. FENCED_INSTANCE_ID means another
process took over this static member's instance id; carrying on would make two owners, so it is
fatal, as in Kafka. Coordinator unavailability and lost connections are retried; if that fails for
a whole session timeout, the session has probably expired, so the partitions count as lost.
INVALID_SESSION_TIMEOUT, INCONSISTENT_GROUP_PROTOCOL, INVALID_GROUP_ID, GROUP_AUTHORIZATION_FAILED
and GROUP_MAX_SIZE_REACHED are refusals no retry can mend: a setting has to change first (the
session timeout, the assignors, the group id, the rights, the group's size). Kafka's
``JoinGroupResponseHandler`` raises them from ``poll()`` as fatal; so they are fatal here, raised
as ``JoinRefusedError`` with a hint naming the setting (``join.join_error_hint``). Before, they
were "anything else", so the member backed off and joined again for ever, and the application
saw the error only as one of many transient ones. For GROUP_MAX_SIZE_REACHED the coordinator has
already removed the member and answers with no member id (Kafka's coordinator does the same), so
the id is forgotten without a LeaveGroup; for the others the member leaves (a new member the
refused join may have added is removed at once instead of at its session's end). Of these,
rcoord's own coordinator answers the first three (INVALID_GROUP_ID only for an empty group id,
which the config refuses before); GROUP_AUTHORIZATION_FAILED comes from a ``Coordinator`` that
checks rights (rcoord's Kafka gateway answers Kafka clients with it), and is fatal in Kafka's
client for every call. Anything else (a subscription the leader cannot decode, an unexpected
code, ...) is reported, and the member leaves and backs off before it joins again (kafka-go's
``run`` loop does the same).

A missing permission is the Redis ACL user's refusal of a command rcoord needs
(``rcoord.errors.is_missing_permission``: NOPERM, an "ACL failure in script" met inside a
function, or ``MissingPermissionError``). It is GROUP_AUTHORIZATION_FAILED in Redis's terms, and
as fatal: a rule has to be added to the user first. The group closes, and ``next()`` and
``poll()`` raise ``MissingPermissionError`` with the server's message from then on. Before, it
was "anything else": the member left, backed off and joined again every ``join_backoff_ms`` for
ever (or, refused a heartbeat, every generation), and the application saw the server's error
once per round among transient ones.

A refused login is Redis's ``AuthenticationError`` (``AuthenticationFailedError``: a wrong
password or user name, a user that is off, or a password rotated while the member ran, met when
a connection is made again). Kafka's consumer raises ``AuthenticationException`` from ``poll()``
as fatal; so the group closes, and ``next()`` and ``poll()`` raise it. Before, redis-py's class
made it a ``ConnectionLost``: the member retried, backed off and joined again for ever, and the
only sign was a warning per round. (Its LeaveGroup is tried, and fails as the login does.)

A replica's answer (READONLY, or MASTERDOWN from a replica serving no stale data) is a
``ConnectionLost`` like any "not now", and retried as one: a failover in progress is over within
the retry bound. One that lasts a whole join's retries, or the coordinator's start for as long,
means the client is connected to a replica, which no retry mends: the group closes with
``ReadOnlyReplicaError``, which says to give the master's URL (``rcoord.client.group``), and
``reaction_for`` answers it with ``ON_A_REPLICA``: no retry, member id reset (without a
LeaveGroup, which the replica would refuse too), partitions lost, fatal. Before, the member
joined again every ``join_backoff_ms`` for ever.

MEMBER_ID_REQUIRED is not in the table: the worker never asks for it (it joins with
``require_known_member_id=False`` and a UUID of its own, ``rcoord.client.join``); a coordinator
that answers it anyway is "anything else". So is ``InvalidAssignmentError`` (a leader's assignor
that gave partitions to a non-member, past a topic's count, or, to a ``ConsumerGroup`` handing
generations out whole, of a topic the member does not subscribe to): the member leaves, backs
off and joins again, and ``next()`` reports it, since the same assignor may answer otherwise
with the next membership.
"""

CONNECTION_LOST = _UNREACHABLE
"""The row for ``ConnectionLost``: Redis could not be reached."""

MISSING_PERMISSION = _REFUSED
"""The row for a permission the Redis user lacks (``is_missing_permission``): fatal."""

AUTHENTICATION_FAILED = _REFUSED
"""The row for a login Redis refused (``AuthenticationFailedError``): fatal."""

ON_A_REPLICA = Reaction(False, "reset", "lost", "fatal")
"""The row for ``ReadOnlyReplicaError``: fatal. The member id is forgotten without a LeaveGroup,
which the replica would refuse as it refused the join (the session ends the member, if the join
ever added one). Looked up by ``reaction_for`` too, so code that asks whether an error the group
raised is fatal (a Spark query's plan) stops on it: taken for "anything else", the query
planned empty batches for ever, warning each time."""

OTHERWISE = Reaction(False, "leave", "lost", "backoff")
"""The row for every error not in ``ERROR_POLICY``."""


def reaction_for(error: Errors | BaseException) -> Reaction:
    """The ``ERROR_POLICY`` row for an error code or an exception."""
    if isinstance(error, AuthenticationFailedError):
        return AUTHENTICATION_FAILED
    if isinstance(error, ReadOnlyReplicaError):
        return ON_A_REPLICA
    if isinstance(error, ConnectionLost):
        return CONNECTION_LOST
    if isinstance(error, BaseException) and is_missing_permission(error):
        return MISSING_PERMISSION
    if isinstance(error, ProtocolError):
        error = error.error
    if isinstance(error, Errors):
        return ERROR_POLICY.get(error, OTHERWISE)
    return OTHERWISE


_THEN_ORDER = {"rejoin": 0, "backoff": 1, "fatal": 2}
_MEMBER_ID_ORDER = {"keep": 0, "reset": 1, "leave": 2}


def combine(a: Reaction, b: Reaction) -> Reaction:
    """The reaction to two errors that ended the same generation: everything either row calls
    for. Picking one row would drop the other's part: a lost connection (backoff, keep the id)
    then a commit answered UNKNOWN_MEMBER_ID (rejoin, forget the id) must back off *and* forget
    the id, or the next JoinGroup carries an id the coordinator already removed."""
    return Reaction(
        retry=a.retry and b.retry,
        member_id=max(a.member_id, b.member_id, key=_MEMBER_ID_ORDER.__getitem__),
        partitions="lost" if a.lost or b.lost else "revoked",
        then=max(a.then, b.then, key=_THEN_ORDER.__getitem__),
    )


def outranks(a: Reaction, b: Reaction) -> bool:
    """Whether ``a`` ends the group's next step more severely than ``b`` (fatal > backoff >
    rejoin): its error is the one reported."""
    return _THEN_ORDER[a.then] > _THEN_ORDER[b.then]
