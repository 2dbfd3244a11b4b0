"""Kafka messages as kio entities: decoding requests, building and encoding responses.

kio (generated from the same JSON message schemas Kafka itself is built from) gives one frozen
dataclass per API, version and nested struct, and a reader and writer for each. Handlers in
this package never name those classes: they read request fields by name, and return a response
as plain data (dicts, lists, ints, ``Errors``) that ``build`` turns into the class of the
version the client asked for. A field that version lacks is dropped, and a field the handler
did not give gets its schema default or a zero, which is how Kafka's own generated code fills
fields across versions. So one handler serves every version of its API.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import logging
import types
import typing
import uuid
from collections.abc import Mapping
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta, i64Timedelta

from .tags import drop_unknown_tags, is_unknown_tag_error

__all__ = [
    "RequestHeaderInfo",
    "build",
    "decode_body",
    "encode_response",
    "millis",
    "parse_header_prefix",
    "request_class",
    "response_class",
]

log = logging.getLogger("rcoord.gateway")

_TIMEDELTAS = (i32Timedelta, i64Timedelta, datetime.timedelta)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclasses.dataclass(frozen=True)
class RequestHeaderInfo:
    """The fields every request header version starts with, read before anything else."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None


def parse_header_prefix(frame: bytes) -> RequestHeaderInfo:
    """api key, version and correlation id: the first 8 bytes of every header version."""
    if len(frame) < 8:
        raise ValueError(f"a request header needs 8 bytes, the frame has {len(frame)}")
    return RequestHeaderInfo(
        int.from_bytes(frame[0:2], "big", signed=True),
        int.from_bytes(frame[2:4], "big", signed=True),
        int.from_bytes(frame[4:8], "big", signed=True),
    )


@functools.cache
def request_class(api_key: int, version: int) -> Any:
    return load_request_schema(api_key, version)


@functools.cache
def response_class(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


def decode_body(api_key: int, version: int, frame: bytes) -> tuple[str | None, Any]:
    """(client id, request entity) of a whole request frame (header and body).

    Tagged fields the request's schema does not name are ignored (``tags``). Raises
    ValueError (or kio's errors) if the frame does not parse as that request. Bytes
    after a body that parsed are ignored, as Kafka's broker ignores them
    (``RequestContext.parseRequest`` checks no remaining bytes): librdkafka's Metadata v9+ for
    all topics, which its regex subscriptions use too, carries 3 (librdkafka issue #5049), and
    refusing them closed its connection, so it never got the metadata.
    """
    cls = request_class(api_key, version)
    header_cls = cls.__header_schema__
    if api_key == _OFFSET_COMMIT and version in _RETENTION_VERSIONS:
        frame = _bounded_retention(header_cls, frame)
    try:
        header, body, used, size = _read(header_cls, cls, frame)
    except KeyError as exc:
        if not is_unknown_tag_error(exc):
            raise
        frame = drop_unknown_tags(frame, header_cls, cls)
        header, body, used, size = _read(header_cls, cls, frame)
        _debug_once("tags", api_key, version, header.client_id, "tagged fields its schema "
                    "does not name ignored, as Kafka's broker ignores them")
    left = len(frame) - used - size
    if left:
        _debug_once("trailing", api_key, version, header.client_id,
                    f"{left} bytes after the request body ignored")
    return header.client_id, body


_OFFSET_COMMIT, _RETENTION_VERSIONS = 8, (2, 3, 4)
_RETENTION_BOUND_MS = 1 << 53
"""OffsetCommit v2-v4's ``retention_time_ms`` is brought within this (either sign) before kio
reads it (``_bounded_retention``): it holds the value in a ``datetime.timedelta``, which ends
near 8.64e16 ms, while the field is any int64. Past it, the decode failed and the connection
was closed unanswered, where Kafka answers (commit time + retention, ``expireTimestampMs``). The
bound changes no answer: ``retention_arg`` takes anything above ``MAX_RETENTION_MS`` (2**52)
as that, and ``_retention_ms`` anything below -1 as "expired at once"."""


def _bounded_retention(header_cls: Any, frame: bytes) -> bytes:
    """``frame`` (OffsetCommit v2-v4, not flexible) with its ``retention_time_ms`` within
    ``_RETENTION_BOUND_MS``: after the header come group_id (int16 length, bytes),
    generation_id (int32), member_id (int16 length, bytes), then the int64 retention. A frame
    too short or with a negative length is left as it is, for kio to refuse."""
    at = entity_reader(header_cls)(memoryview(frame), 0)[1]
    for skip in (0, 4):  # group_id, then generation_id and member_id
        at += skip
        if len(frame) < at + 2:
            return frame
        size = int.from_bytes(frame[at:at + 2], "big", signed=True)
        if size < 0:
            return frame
        at += 2 + size
    if len(frame) < at + 8:
        return frame
    retention = int.from_bytes(frame[at:at + 8], "big", signed=True)
    bounded = max(-_RETENTION_BOUND_MS, min(retention, _RETENTION_BOUND_MS))
    if bounded == retention:
        return frame
    return frame[:at] + bounded.to_bytes(8, "big", signed=True) + frame[at + 8:]


_LOGGED: set[tuple[str, int, int]] = set()
"""(what, API key, version)s logged by ``_debug_once``."""


def _debug_once(what: str, api_key: int, version: int, client_id: str | None, says: str
                ) -> None:
    """Log ``says`` of a request once per API version and kind (a client that sends such a
    request sends it every time)."""
    if (what, api_key, version) not in _LOGGED:
        _LOGGED.add((what, api_key, version))
        log.debug("API key %d v%d from client id %r: %s (logged once per API version)",
                  api_key, version, client_id, says)


def _read(header_cls: Any, cls: Any, frame: bytes) -> tuple[Any, Any, int, int]:
    view = memoryview(frame)
    header, used = entity_reader(header_cls)(view, 0)
    body, size = entity_reader(cls)(view, used)
    return header, body, used, size


def encode_response(api_key: int, version: int, correlation_id: int, data: Mapping[str, Any]
                    ) -> bytes:
    """The response frame body (header and payload, without the size prefix)."""
    cls = response_class(api_key, version)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, build(header_cls, {"correlation_id": correlation_id}))
    entity_writer(cls)(buf, build(cls, data))
    return buf.getvalue()


def millis(value: Any) -> int:
    """A kio timedelta field (or a plain int) as integer milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build(cls: Any, data: Mapping[str, Any]) -> Any:
    """An instance of the kio class ``cls`` from plain data (see the module docstring)."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(hints[f.name])
    return cls(**kwargs)


def _optional(tp: Any) -> tuple[bool, Any]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return True, args[0]
    return False, tp


def _convert(tp: Any, value: Any) -> Any:
    nullable, inner = _optional(tp)
    if value is None:
        return None if nullable else _zero(inner)
    if inner is ErrorCode:
        return ErrorCode(int(value))
    if isinstance(inner, type) and issubclass(inner, datetime.datetime) and isinstance(value, int):
        if value < 0:  # Kafka's -1: no timestamp
            return None if nullable else _EPOCH
        return _EPOCH + datetime.timedelta(milliseconds=value)
    if isinstance(inner, type) and issubclass(inner, _TIMEDELTAS):
        return value if isinstance(value, datetime.timedelta) else datetime.timedelta(
            milliseconds=int(value))
    if typing.get_origin(inner) is tuple:
        item = typing.get_args(inner)[0]
        return tuple(_convert(item, v) for v in value)
    if dataclasses.is_dataclass(inner) and isinstance(value, Mapping):
        return build(inner, value)
    return value


def _zero(tp: Any) -> Any:
    nullable, inner = _optional(tp)
    if nullable:
        return None
    if inner is ErrorCode:
        return ErrorCode.none
    if isinstance(inner, type) and issubclass(inner, _TIMEDELTAS):
        return datetime.timedelta(0)
    if typing.get_origin(inner) is tuple:
        return ()
    if dataclasses.is_dataclass(inner):
        return build(inner, {})
    if inner is uuid.UUID:
        return uuid.UUID(int=0)
    if isinstance(inner, type) and issubclass(inner, datetime.datetime):
        return _EPOCH  # (a timestamp no handler gave: the delegation token APIs' error answers)
    if isinstance(inner, type):
        for base in (bool, int, float, str, bytes):
            if issubclass(inner, base):
                return base()
    raise TypeError(f"no zero value for {tp!r}")
