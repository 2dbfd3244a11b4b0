"""Unknown tagged fields in a request, dropped before kio reads it.

A flexible request version may carry tagged fields its schema does not name: Kafka adds tagged
fields to an existing version without raising it (that is what they are for, KIP-482), so a
newer client sends them to an older broker, which keeps their bytes and ignores them
(``Readable.readUnknownTaggedField``). kio's reader refuses them instead (``KeyError: Unknown
tagged field tag``), and the gateway closed the connection unanswered. ``drop_unknown_tags``
walks a frame by the kio schema and writes it again without them, so kio can read it. It runs
only when kio has refused a frame, so a frame without such fields costs nothing.

A known tagged field is copied as it came (its bytes are not walked), so an unknown tag inside
a known tagged struct still fails the read, as before; no request the gateway serves has one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from kio.serial._introspect import EntityField, EntityTupleField, classify_field, is_optional

__all__ = ["drop_unknown_tags", "encode_uvarint", "is_unknown_tag_error"]

_FIXED = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "float64": 8,
    "uuid": 16, "timedelta_i32": 4, "timedelta_i64": 8,
}


def is_unknown_tag_error(exc: BaseException) -> bool:
    """Whether ``exc`` is kio's refusal of a tagged field its schema does not name."""
    return isinstance(exc, KeyError) and "Unknown tagged field" in str(exc)


def drop_unknown_tags(frame: bytes, header_cls: Any, body_cls: Any) -> bytes:
    """``frame`` (request header and body, no size prefix) without the tagged fields their
    schemas do not name; bytes after the body are kept. Raises ValueError if the frame is
    shorter than its schema says."""
    view = memoryview(frame)
    out = bytearray()
    try:
        pos = _entity(header_cls, view, 0, out)
        pos = _entity(body_cls, view, pos, out)
    except IndexError:
        raise ValueError("the request ends inside a field") from None
    if pos > len(view):
        raise ValueError("the request ends inside a field")
    out += view[pos:]
    return bytes(out)


@functools.cache
def _layout(cls: Any) -> tuple[tuple[dataclasses.Field[Any], ...], frozenset[int]]:
    """(untagged fields in wire order, the tags the schema names)."""
    untagged, tags = [], set()
    for f in dataclasses.fields(cls):
        if "tag" in f.metadata:
            tags.add(int(f.metadata["tag"]))
        else:
            untagged.append(f)
    return tuple(untagged), frozenset(tags)


def _entity(cls: Any, buf: memoryview, pos: int, out: bytearray) -> int:
    untagged, known = _layout(cls)
    flexible = bool(cls.__flexible__)
    legacy_client_id = cls.__name__ == "RequestHeader"
    start = pos
    for f in untagged:
        kind = classify_field(f)
        if isinstance(kind, EntityField | EntityTupleField):
            out += buf[start:pos]
            pos = _nested(f, kind, flexible, buf, pos, out)
            start = pos
        else:
            compact = flexible and not (legacy_client_id and f.name == "client_id")
            pos = _primitive_field(f, kind.is_array, compact, buf, pos)
    out += buf[start:pos]
    if not flexible:
        return pos
    count, pos = _uvarint(buf, pos)
    kept = []
    for _ in range(count):
        begin = pos
        tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
        if tag in known:
            kept.append(buf[begin:pos])
    out += encode_uvarint(len(kept))
    for field_bytes in kept:
        out += field_bytes
    return pos


def _nested(f: dataclasses.Field[Any], kind: Any, flexible: bool, buf: memoryview, pos: int,
            out: bytearray) -> int:
    if isinstance(kind, EntityTupleField):
        count, after = _array_count(flexible, buf, pos)
        out += buf[pos:after]
        pos = after
        for _ in range(count):
            pos = _entity(kind.type_, buf, pos, out)
        return pos
    if is_optional(f):  # (KIP-893: a nullable struct starts with a marker byte, -1 for null)
        marker = buf[pos]
        out += buf[pos:pos + 1]
        pos += 1
        if marker == 0xFF:
            return pos
    return _entity(kind.type_, buf, pos, out)


def _primitive_field(f: dataclasses.Field[Any], is_array: bool, compact: bool, buf: memoryview,
                     pos: int) -> int:
    kafka_type = f.metadata["kafka_type"]
    if not is_array:
        return _primitive(kafka_type, compact, buf, pos)
    count, pos = _array_count(compact, buf, pos)
    for _ in range(count):
        pos = _primitive(kafka_type, compact, buf, pos)
    return pos


def _primitive(kafka_type: str, compact: bool, buf: memoryview, pos: int) -> int:
    fixed = _FIXED.get(kafka_type)
    if fixed is not None:
        return pos + fixed
    if compact:  # (length + 1 as an unsigned varint; 0 is null)
        size, pos = _uvarint(buf, pos)
        return pos + max(size - 1, 0)
    width = 2 if kafka_type == "string" else 4  # (bytes, records: int32; -1 is null)
    size = int.from_bytes(buf[pos:pos + width], "big", signed=True)
    return pos + width + max(size, 0)


def _array_count(compact: bool, buf: memoryview, pos: int) -> tuple[int, int]:
    if compact:
        size, pos = _uvarint(buf, pos)
        return max(size - 1, 0), pos
    return max(int.from_bytes(buf[pos:pos + 4], "big", signed=True), 0), pos + 4


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ValueError("an unsigned varint longer than 5 bytes")


def encode_uvarint(value: int) -> bytes:
    """Kafka's unsigned varint: 7 bits a byte, low bits first (``records`` zigzags signed
    values into it)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
