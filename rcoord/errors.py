"""Errors: Kafka's protocol error codes, and the few exceptions rcoord raises.

Hierarchy::

    RcoordError
    ├── ConfigError            (also ValueError) a setting is out of range or conflicts with Redis
    ├── InvalidRequestError    (also ValueError) an argument can never be valid (size, type, charset)
    ├── ConnectionLost         Redis could not be reached or the connection dropped mid-call
    │   ├── ServerUnavailable  Redis answered that it cannot run the call now (READONLY, BUSY, OOM..)
    │   └── DeleteRecordsIncomplete  (rcoord.topics) lost partway: the partitions done, the rest
    ├── MissingPermissionError the Redis ACL user may not run a command rcoord needs
    ├── AuthenticationFailedError  Redis refused the login (wrong user or password, user off)
    ├── ParkAbandonedError     a parked JoinGroup/SyncGroup was given up because its caller closes
    ├── ScriptError            a Lua script reported a named internal error (a bug, never user input)
    │   └── IllegalStateError  an invariant of the group state machine would have been broken
    ├── GroupClosedError, GenerationEndedError, ReadOnlyReplicaError   (worker client,
    │                          rcoord/client/errors.py)
    └── ProtocolError          a Kafka error code raised as an exception (``error``, ``retriable``)
        ├── UnknownMemberIdError, IllegalGenerationError, RebalanceInProgressError,
        ├── FencedInstanceIdError, CoordinatorNotAvailableError, NotCoordinatorError, ...
        ├── CommitFailedError  (worker client) a commit fenced because the group rebalanced
        ├── TopicError         (rcoord.topics) a topic or partition request failed
        └── (every other code maps to ProtocolError itself through ``for_code``)

The coordinator API returns ``Errors`` values inside its results wherever Kafka answers with an
error code; exceptions are for programming errors and lost connections. The worker client uses
``ProtocolError.for_code`` to turn a result's code into an exception when it wants one.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions

__all__ = [
    "AuthenticationFailedError",
    "ConfigError",
    "ConnectionLost",
    "CoordinatorNotAvailableError",
    "Errors",
    "FencedInstanceIdError",
    "IllegalGenerationError",
    "IllegalStateError",
    "InvalidRequestError",
    "MissingPermissionError",
    "NotCoordinatorError",
    "ParkAbandonedError",
    "ProtocolError",
    "RcoordError",
    "RebalanceInProgressError",
    "ScriptError",
    "ServerUnavailable",
    "UnknownMemberIdError",
    "as_authentication_failed",
    "as_missing_permission",
    "is_missing_function",
    "is_missing_permission",
    "raise_for_script_error",
    "reraise_as_rcoord",
    "script_error_names",
    "translate_redis_errors",
]


class Errors(enum.IntEnum):
    """Kafka's error codes (``org.apache.kafka.common.protocol.Errors``), same names and numbers."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    GROUP_AUTHORIZATION_FAILED = 30
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90

    @property
    def retriable(self) -> bool:
        """Whether Kafka marks the error retriable (the same request may succeed later)."""
        return self in _RETRIABLE

    @classmethod
    def from_name(cls, name: str | bytes) -> Errors:
        """Map a named error returned by a Lua script; unknown names are a server error."""
        if isinstance(name, bytes):
            name = name.decode()
        try:
            return cls[name]
        except KeyError:
            return cls.UNKNOWN_SERVER_ERROR


_RETRIABLE = frozenset(
    {
        Errors.REQUEST_TIMED_OUT,
        Errors.COORDINATOR_LOAD_IN_PROGRESS,
        Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.NOT_COORDINATOR,
        Errors.UNKNOWN_TOPIC_OR_PARTITION,
        Errors.UNSTABLE_OFFSET_COMMIT,
    }
)


class RcoordError(Exception):
    """Base of every exception rcoord raises."""


class ConfigError(RcoordError, ValueError):
    """A configuration value is invalid, or conflicts with what the namespace stores in Redis."""


class InvalidRequestError(RcoordError, ValueError):
    """An argument that no coordinator could ever accept (wrong size or characters)."""


class ConnectionLost(RcoordError):
    """Redis was unreachable or the connection dropped; the call may or may not have applied.

    Every rcoord script is safe to retry (see docs/architecture.md, "Retries"), so the usual
    reaction is to back off and call again.
    """


class ServerUnavailable(ConnectionLost):
    """Redis answered that it cannot run the call now, and did not run it: a replica's READONLY (a
    failover the client's connection has not followed yet), or the UNBLOCKED that ended a parked
    JoinGroup's or SyncGroup's wait as a failover demoted its master, BUSY (another script
    running past busy-reply-threshold), TRYAGAIN (a slot migrating), a function or script still
    missing after ``rcoord.scripts.MAX_RELOADS`` loads, or OOM (used memory above ``maxmemory``
    under a no-eviction policy; Redis refuses a function at its start and a script at its first
    write that may use memory, unless it wrote already, so a refused call wrote nothing; it
    lasts until retention, consumers or an operator free memory; the heartbeat is flagged
    ``allow-oom`` and answers then), or NOREPLICAS (the master has
    fewer replicas within ``min-replicas-max-lag`` than ``min-replicas-to-write``, the setting
    docs/guarantees.md suggests; nothing of the call ran), or MISCONF (the last RDB save failed
    and ``stop-writes-on-bgsave-error`` is on: writes are refused until a save succeeds).
    Kafka's answer in those moments is COORDINATOR_NOT_AVAILABLE (NOT_COORDINATOR for a log that
    cannot be written), which clients retry keeping their member id; a ``ConnectionLost`` gets
    the same reaction everywhere (the worker client backs off and retries; the gateway answers a
    group request with COORDINATOR_NOT_AVAILABLE), instead of the one for an unknown error,
    which leaves the group."""


def is_missing_function(exc: BaseException) -> bool:
    """Whether a server error says the called function is not loaded (Redis and Valkey answer
    "ERR Function not found"; redis-py drops the code). The whole answer, not words in it: a
    script's error that holds them ran."""
    return (isinstance(exc, redis.exceptions.ResponseError)
            and str(exc).strip().lower().removeprefix("err ") == "function not found")


def _cannot_run_now(exc: redis.exceptions.ResponseError) -> bool:
    """The answers ``ServerUnavailable`` stands for (redis-py has classes for some; BUSY,
    NOREPLICAS and UNBLOCKED come as plain errors whose text starts with the code)."""
    if isinstance(exc, (redis.exceptions.ReadOnlyError, redis.exceptions.TryAgainError,
                        redis.exceptions.NoScriptError)):
        return True
    return str(exc).startswith(_NOT_NOW_CODES) or is_missing_function(exc)


_NOT_NOW_CODES = ("BUSY ", "NOREPLICAS ", "UNBLOCKED ")
"""Error codes redis-py has no class for that say "not now, and nothing ran": BUSY (another
script past busy-reply-threshold), NOREPLICAS (fewer replicas than ``min-replicas-to-write``
within ``min-replicas-max-lag``: the master refuses every function that may write, before it
runs) and UNBLOCKED (a blocking read ended by the server: a master turned replica by a
failover ends every blocked XREAD so, which is where parked JoinGroups and SyncGroups wait;
the parked member is as it was). NOREPLICAS is Kafka's NOT_ENOUGH_REPLICAS, which its group
coordinator answers as COORDINATOR_NOT_AVAILABLE (``GroupMetadataManager``), so clients retry
keeping their member id."""


class MissingPermissionError(RcoordError):
    """The Redis ACL user may not run a command rcoord needs; the message names the rule to add
    (docs/security.md lists the rules of each role)."""


class AuthenticationFailedError(RcoordError):
    """Redis refused the login: a wrong password or user name, a user that is off, or none
    given where one is required (WRONGPASS, NOAUTH, "invalid username-password pair"; also
    after a password rotation, when a connection is made again with the old one).

    Not a ``ConnectionLost``, though redis-py makes its ``AuthenticationError`` a
    ``ConnectionError``: no retry mends it until the user or password is changed, so
    treating it as "back off and call again" made a group rejoin for ever with only a
    warning to show for it. Kafka's client raises ``AuthenticationException`` from
    ``poll()`` as fatal too. The worker's policy closes the group on it
    (``rcoord.client.policy``); the redis-py error is its ``__cause__``."""


_NO_CREDENTIALS = re.compile(r"called with the client already authenticated|^authentication "
                             r"required|NOAUTH", re.IGNORECASE)


def as_authentication_failed(name: str, exc: BaseException,
                             url: str | None = None) -> AuthenticationFailedError:
    """redis-py's ``AuthenticationError`` as an ``AuthenticationFailedError`` whose message says
    what to check, naming ``url`` (its password masked) when the caller knows it."""
    from .urls import redact_url

    at = f" at {redact_url(url)}" if url else ""
    text = " ".join(str(exc).split()).rstrip(".")
    if _NO_CREDENTIALS.search(text):
        # (the server's words for a login with no credentials are about its HELLO or AUTH
        # commands, which the caller never typed)
        text = "the server needs a password and the URL gives none"
    error = AuthenticationFailedError(
        f"{name}: Redis{at} refused the login ({text}); check the user and password in the "
        "Redis URL (redis://USER:PASSWORD@HOST:PORT), and that the ACL user is on and has "
        "that password")
    error.__cause__ = exc
    return error


def is_missing_permission(exc: BaseException) -> bool:
    """Whether an error says that the Redis ACL user may not do what rcoord asked: rcoord's
    ``MissingPermissionError``, the server's NOPERM reply to a command (redis-py's
    ``NoPermissionError``), or the same refusal met by a command inside a function or script,
    which the server sends as a plain error without the NOPERM code ("ACL failure in script:
    User u has no permissions to run the 'xadd' command ..."). No retry mends any of them: a
    rule has to be added to the user first."""
    if isinstance(exc, (MissingPermissionError, redis.exceptions.NoPermissionError)):
        return True
    return (isinstance(exc, redis.exceptions.ResponseError)
            and "acl failure in script" in str(exc).lower())


_DENIED_KEY = re.compile(r"to access (a key|one of the keys)", re.IGNORECASE)
_DENIED_CHANNEL = re.compile(r"to access (a channel|one of the channels)", re.IGNORECASE)
"""A refused key or channel, in the words of Redis and Valkey 7.2 and later ("No permissions to
access a key") and of Redis 7.0 ("this user has no permissions to access one of the keys used
as arguments"). Unlike a refused command, neither names what was refused, nor what to grant."""


def as_missing_permission(exc: BaseException,
                          namespace: str | None = None) -> MissingPermissionError:
    """A permission error (``is_missing_permission``) as a ``MissingPermissionError``: the
    server's words, and where the rules are; the server's error is its ``__cause__``.

    A refused command names itself (a refused FUNCTION LOAD also says the other way out,
    docs/security.md's: an operator loads the library); a refused key or channel does not
    (the server's words are only "No permissions to access a key"), so the message adds the
    pattern every rcoord key or channel of the namespace matches, ``~<namespace>:*`` or
    ``&<namespace>:*``, with the namespace filled in when the caller knows it (a
    ``MissingPermissionError`` made without it, from a server's error, is made again with
    it)."""
    if isinstance(exc, MissingPermissionError):
        cause = exc.__cause__
        if namespace is None or cause is None or not is_missing_permission(cause):
            return exc
        exc = cause
    text = " ".join(str(exc).split()).rstrip(".")
    ns = namespace if namespace is not None else "<namespace>"
    of = f"namespace {namespace!r}" if namespace is not None else "the namespace setting"
    hint = ""
    if _DENIED_KEY.search(text):
        hint = (f" (rcoord's keys are all named {ns}:..., for {of}: the user's key patterns "
                f"must include ~{ns}:*)")
    elif _DENIED_CHANNEL.search(text):
        hint = (f" (rcoord's channels are all named {ns}:..., for {of}: the user's channel "
                f"patterns must include &{ns}:*)")
    elif "'function|load'" in text:
        hint = (" (the server does not hold rcoord's function library, and this user may not "
                "load it: grant +function|load, or, where tenants must not load code, have an "
                "operator load rcoord.scripts.library_source() on every master with FUNCTION "
                "LOAD REPLACE)")
    error = MissingPermissionError(
        f"the Redis user may not do what rcoord needs: {text}{hint}; add the missing rule to "
        "its ACL rules (docs/security.md lists the rules of each role)"
    )
    error.__cause__ = exc
    return error


class ParkAbandonedError(RcoordError):
    """A blocking JoinGroup or SyncGroup stopped waiting for its parked reply because the event
    its caller named (``rcoord.flow.abandon_parked_when``) was set: the caller is closing.

    Nothing was undone on the server: the member stays parked there (a static member keeps its
    place and its session runs on), and the reply, once written, is pruned unread. Kafka's Java
    consumer does the same when it closes during a rebalance: it drops its in-flight request.
    The worker client raises it only after ``close()``, which takes it as the end of the run.
    """


class ScriptError(RcoordError):
    """A Lua script returned a named error that signals a bug rather than bad input."""


class IllegalStateError(ScriptError):
    """A transition outside the declared state table was attempted (see rcoord.state)."""


class ProtocolError(RcoordError):
    """A Kafka protocol error raised as an exception; ``error`` holds the code."""

    error: Errors = Errors.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", error: Errors | None = None) -> None:
        if error is not None:
            self.error = error
        super().__init__(message or self.error.name)

    @property
    def retriable(self) -> bool:
        return self.error.retriable

    @staticmethod
    def for_code(error: Errors | int) -> type[ProtocolError]:
        """The exception class for a code: a named subclass where one exists, else the base."""
        return _BY_CODE.get(Errors(error), ProtocolError)

    @classmethod
    def of(cls, error: Errors | int, message: str = "") -> ProtocolError:
        """An instance for ``error``, carrying the code even when no subclass is named for it."""
        error = Errors(error)
        return cls.for_code(error)(message, error)


class UnknownMemberIdError(ProtocolError):
    error = Errors.UNKNOWN_MEMBER_ID


class IllegalGenerationError(ProtocolError):
    error = Errors.ILLEGAL_GENERATION


class RebalanceInProgressError(ProtocolError):
    error = Errors.REBALANCE_IN_PROGRESS


class FencedInstanceIdError(ProtocolError):
    error = Errors.FENCED_INSTANCE_ID


class CoordinatorNotAvailableError(ProtocolError):
    error = Errors.COORDINATOR_NOT_AVAILABLE


class NotCoordinatorError(ProtocolError):
    """The caller addressed a group under a layout the namespace does not hold (its partition
    count is stale, or the settings were lost with the data): re-read the settings and retry,
    as a Kafka client looks the coordinator up again. The coordinators do this by themselves."""

    error = Errors.NOT_COORDINATOR


_BY_CODE: dict[Errors, type[ProtocolError]] = {
    c.error: c
    for c in (
        UnknownMemberIdError,
        IllegalGenerationError,
        RebalanceInProgressError,
        FencedInstanceIdError,
        CoordinatorNotAvailableError,
        NotCoordinatorError,
    )
}

# Named error replies a script may return (``return redis.error_reply("RCOORD_<NAME> text")``).
# This is the one place that maps them to exceptions.
_SCRIPT_ERRORS: dict[str, type[RcoordError]] = {
    "RCOORD_ILLEGAL_STATE": IllegalStateError,
    "RCOORD_BAD_ARGUMENT": InvalidRequestError,
    "RCOORD_CONFIG": ConfigError,
    "RCOORD_NOT_COORDINATOR": NotCoordinatorError,
}


def script_error_names() -> tuple[str, ...]:
    """The named error replies a script may return (rendered into the library as constants by
    ``rcoord.contract``, so a script cannot name one this registry lacks)."""
    return tuple(_SCRIPT_ERRORS)


def raise_for_script_error(exc: redis.exceptions.ResponseError) -> None:
    """Re-raise a script's named error reply as its rcoord exception (others are left alone)."""
    text = str(exc)
    for marker, cls in _SCRIPT_ERRORS.items():
        pos = text.find(marker)
        if pos >= 0:
            raise cls(text[pos + len(marker) :].strip()) from exc


F = TypeVar("F", bound=Callable[..., Any])


def reraise_as_rcoord(name: str, exc: BaseException) -> None:
    """Raise the rcoord exception for a redis-py one, if it has one (else return).

    Shared by the blocking boundary (``translate_redis_errors``) and the asyncio one.
    """
    if isinstance(exc, redis.exceptions.AuthenticationError):
        # (before ConnectionError, of which redis-py makes it a subclass: no retry mends it)
        raise as_authentication_failed(name, exc) from exc
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        # (redis-py's asyncio cluster raises MaxConnectionsError() with no words: its name)
        raise ConnectionLost(f"{name}: {str(exc) or type(exc).__name__}") from exc
    if isinstance(exc, (redis.exceptions.ClusterError, redis.exceptions.RedisClusterException)):
        # redis-py gives up on a slot after a bounded number of redirections: "TTL
        # exhausted" when a multi-key script keeps meeting TRYAGAIN while its slot migrates
        # (its keys are split between two masters), CLUSTERDOWN while the cluster fails
        # over, SlotNotCoveredError while no node is known for a slot. The script did not
        # run; the slot will settle, so it is worth a retry.
        raise ConnectionLost(f"{name}: slot unavailable for now ({exc})") from exc
    if isinstance(exc, redis.exceptions.ResponseError):
        if is_missing_permission(exc):
            # The same words the worker's policy raises (rcoord.client.policy), from every
            # call: the admin API, Topics, a manual commit.
            raise as_missing_permission(exc) from exc
        raise_for_script_error(exc)
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            raise ServerUnavailable(
                f"{name}: Redis is out of memory (used memory > maxmemory) and refused to write; "
                f"free memory (topic retention, deleting data) or raise maxmemory, then try "
                f"again ({exc})") from exc
        if str(exc).startswith("MISCONF "):
            # Redis's last RDB save failed and stop-writes-on-bgsave-error is on: it refuses
            # every function (and a script at its first write) until a save succeeds. Kafka
            # answers a group write its log could not store as NOT_COORDINATOR (retriable).
            raise ServerUnavailable(
                f"{name}: Redis refuses writes because its last RDB save failed "
                f"(stop-writes-on-bgsave-error); fix what failed the save (disk space, the "
                f"permissions of its dir), then try again ({exc})") from exc
        if _cannot_run_now(exc):
            raise ServerUnavailable(f"{name}: Redis cannot run this now; try again ({exc})") from exc


def translate_redis_errors(fn: F) -> F:
    """The single boundary where redis-py exceptions become rcoord exceptions."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            reraise_as_rcoord(fn.__name__, exc)
            raise

    return wrapper  # type: ignore[return-value]
