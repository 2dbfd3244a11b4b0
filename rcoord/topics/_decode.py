"""Stream entries to Records: the read path's hot loop.

A fetch of 500 records spends most of its client time here, so the loop is written for speed.
Entries arrive as ``(id, [name, value, ...])``, the flat form the server sends, because
``rcoord.topics.fetch`` reads on a standalone server without redis-py's XRANGE reply callback
(pairing each entry into a dict cost about as much as the whole decode); the common layout (a
timestamp and a value) is read by position. A ``Record`` is built by filling a fresh instance's
``__dict__`` instead of calling the frozen dataclass's ``__init__``, which sets each field
through ``object.__setattr__`` and costs about twice as much. The result is an ordinary
``Record`` (equal to, and indistinguishable from, one built by its constructor);
``tests/test_topics.py`` checks that for every layout. Entry fields (``lua/topic_append*.lua``,
the only writer, in this order): ``t`` timestamp ms, ``v`` value, ``k`` key, ``h`` msgpack'd
header pairs (``[[name, value], ...]``, in order, names may repeat, values may be nil); a missing
``v`` or ``k`` is ``None``. A record's ``header_list`` is those pairs as a tuple of tuples (the
shared empty tuple when there are none) and ``headers`` their dict (last value per name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import msgpack

from ._base import Record

R = TypeVar("R")

_new = object.__new__
_set = object.__setattr__
_unpack = msgpack.unpackb

if hasattr(Record, "__slots__"):  # pragma: no cover - a guard for a future Record change
    raise ImportError("rcoord.topics._decode fills Record.__dict__; Record must not use slots")


def decode_entries(entries: Sequence[Sequence[Any]]) -> list[Record]:
    """Records of XRANGE entries ``(b"0-<offset + 1>", fields)``, in order.

    ``fields`` is the flat ``[name, value, ...]`` list the server sent when no reply callback
    ran (``rcoord.topics.fetch`` reads that way: redis-py's XRANGE callback pairs every entry
    into a dict, which costs as much as this whole loop), and a dict when the callback ran (a
    plain ``client.xrange``, or a cluster pipeline).
    """
    return _decode(entries, Record, None)


def decode_entries_as(
    entries: Sequence[Sequence[Any]], record_type: type[R], topic: str, partition: int
) -> list[R]:
    """As ``decode_entries``, but each record is a ``record_type`` carrying ``topic`` and
    ``partition`` too: a frozen dataclass without slots whose fields are ``topic``,
    ``partition`` and then Record's (the consumer's ``ConsumerRecord``). Building those directly
    spares one object and its dict per record, which a consumer otherwise copied every Record
    into (and which Python's collector then had to walk while the records were buffered)."""
    if record_type not in _CHECKED:
        _check_record_type(record_type)
        _CHECKED.add(record_type)
    return _decode(entries, record_type, (topic, partition))


_CHECKED: set[type[Any]] = set()


def _check_record_type(record_type: type[Any]) -> None:
    want = ["topic", "partition", *(f.name for f in dataclasses.fields(Record))]
    if (
        not dataclasses.is_dataclass(record_type)
        or hasattr(record_type, "__slots__")
        or [f.name for f in dataclasses.fields(record_type)] != want
    ):
        raise TypeError(
            f"{record_type.__name__} must be a dataclass without slots with the fields {want}"
        )


def _decode(
    entries: Sequence[Sequence[Any]], record_type: type[R], head: tuple[str, int] | None
) -> list[R]:
    if not entries:
        return []
    if not isinstance(entries[0][1], dict):
        # Ids are "0-<offset + 1>" and a partition's offsets have no gaps (appends take the
        # next sequence, trimming removes a prefix), so one reply's offsets are consecutive:
        # parse the first and the last id, and count in between. A reply that is not
        # consecutive (no writer makes one) is paired and parsed id by id.
        first = int(entries[0][0][2:]) - 1
        if int(entries[-1][0][2:]) - 1 == first + len(entries) - 1:
            return _decode_flat(entries, first, record_type, head)
        entries = [(e[0], dict(zip(e[1][::2], e[1][1::2]))) for e in entries]
    out: list[R] = []
    append = out.append
    for entry_id, fields in entries:
        rec = _new(record_type)
        _set(rec, "__dict__", _fields(int(entry_id[2:]) - 1, fields, head))  # ids: "0-<seq>"
        append(rec)
    return out


def _decode_flat(
    entries: Sequence[Sequence[Any]], offset: int, record_type: type[R],
    head: tuple[str, int] | None,
) -> list[R]:
    """The hot loop: flat fields, consecutive offsets from ``offset``. The common layout, ``t``
    (always written first) and a value with no key and no headers, is read by position; the
    two copies of the loop differ only in the dict they fill (a branch per record cost more)."""
    out: list[R] = []
    append = out.append
    if head is None:
        for _, f in entries:
            rec = _new(record_type)
            if len(f) == 4 and f[2] == b"v":
                _set(rec, "__dict__", {
                    "offset": offset,
                    "key": None,
                    "value": f[3],
                    "headers": {},
                    "timestamp_ms": int(f[1]),
                    "header_list": (),
                })
            else:
                _set(rec, "__dict__", _fields(offset, dict(zip(f[::2], f[1::2])), None))
            append(rec)
            offset += 1
        return out
    topic, partition = head
    for _, f in entries:
        rec = _new(record_type)
        if len(f) == 4 and f[2] == b"v":
            _set(rec, "__dict__", {
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "key": None,
                "value": f[3],
                "headers": {},
                "timestamp_ms": int(f[1]),
                "header_list": (),
            })
        else:
            _set(rec, "__dict__", _fields(offset, dict(zip(f[::2], f[1::2])), head))
        append(rec)
        offset += 1
    return out


def _fields(
    offset: int, fields: Mapping[bytes, bytes], head: tuple[str, int] | None
) -> dict[str, Any]:
    """A record's ``__dict__`` from its offset and its entry's paired fields."""
    raw_headers = fields.get(b"h")
    # use_list=False: the pairs come out as a tuple of tuples, ready for header_list.
    pairs = () if raw_headers is None else _unpack(raw_headers, raw=False, use_list=False)
    own = {
        "offset": offset,
        "key": fields.get(b"k"),
        "value": fields.get(b"v"),
        "headers": dict(pairs),
        "timestamp_ms": int(fields[b"t"]),
        "header_list": pairs,
    }
    return own if head is None else {"topic": head[0], "partition": head[1], **own}

