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

An entry that is not such a record (added with XADD by hand: no ``t``, a ``t`` that is not an
integer, ``h`` that is not msgpack'd ``[[str, bytes or nil], ...]``) raises ``CorruptEntry``
naming its offset and what is wrong (``rcoord.topics.fetch`` makes it a ``TopicError``): it
used to escape as a bare KeyError, ValueError, TypeError or msgpack error, or to decode as a
wrong record (an entry ``x 1 v a`` read with timestamp 1, headers of a msgpack map as a dict
in ``header_list``, text header values as ``str``). Fields of other names are ignored.
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


class CorruptEntry(ValueError):
    """A stream entry that is not a record rcoord's appends write (the module docstring);
    ``at`` is its index in the entries decoded (those before it are records)."""

    at: int = 0


_BAD = (KeyError, ValueError, TypeError, IndexError, msgpack.UnpackException)
"""What decoding an entry that is not a record raises (``_corrupt`` then says which and why)."""


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
    try:
        return _decode_any(entries, record_type, head)
    except _BAD:  # (CorruptEntry too: found again one by one, for its index)
        raise _corrupt(entries) from None


def _corrupt(entries: Sequence[Sequence[Any]]) -> CorruptEntry:
    """The ``CorruptEntry`` for the first entry of ``entries`` that is not a record, with its
    index (``_first_corrupt``)."""
    at, exc = _first_corrupt(entries)
    exc.at = at
    return exc


def _first_corrupt(entries: Sequence[Sequence[Any]]) -> tuple[int, CorruptEntry]:
    """The index and ``CorruptEntry`` of the first entry of ``entries`` that is not a record
    (one by one: the fast loops read several fields without checking them, and a reply's
    offsets are consecutive only when its ids are rcoord's)."""
    at = -1
    for entry_id, fields in entries:
        at += 1
        ident = entry_id.decode(errors="replace") if isinstance(entry_id, bytes) else entry_id
        try:
            offset = int(ident.partition("0-")[2]) - 1
            if not ident.startswith("0-") or offset < 0:
                raise ValueError
        except ValueError:
            return at, CorruptEntry(f"the stream entry {ident} is not a record: its id is not "
                                    "0-<offset + 1>, which rcoord's appends give")
        if not isinstance(fields, dict):
            fields = dict(zip(fields[::2], fields[1::2]))
        try:
            _fields(offset, fields, None)
        except CorruptEntry as exc:
            return at, exc
        except _BAD:
            stamp: Any = fields.get(b"t")
            why = "its h (headers) field is not msgpack"
            if stamp is None:
                why = "it has no t (timestamp) field"
            else:
                try:
                    int(stamp)
                except ValueError:
                    why = f"its t (timestamp) field is {stamp!r}, not an integer"
            return at, _bad(offset, why)
    return 0, CorruptEntry("a stream entry is not a record")  # (not reached: one of them failed)


def _bad(offset: int, why: str) -> CorruptEntry:
    return CorruptEntry(
        f"the stream entry at offset {offset} (id 0-{offset + 1}) is not a record: {why}; "
        "rcoord's appends write t (timestamp ms), then v, k and h (msgpack'd [[name, value], "
        "...] headers). An entry added with XADD by hand? Topics.delete_records(topic, "
        f"{{partition: {offset + 1}}}) removes it and the records before it")


def _decode_any(
    entries: Sequence[Sequence[Any]], record_type: type[R], head: tuple[str, int] | None
) -> list[R]:
    # Ids of another form ("5-3": an XADD by hand) parsed as "0-" ones read a wrong offset.
    # Ids ascend, so the first and the last being 0-<seq> make every one between so too.
    if entries[0][0][:2] != b"0-" or entries[-1][0][:2] != b"0-":
        raise ValueError("not an id of rcoord's")
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
            if len(f) == 4 and f[2] == b"v" and f[0] == b"t":
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
        if len(f) == 4 and f[2] == b"v" and f[0] == b"t":
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
    if raw_headers is not None and not _header_pairs(pairs):
        raise _bad(offset, f"its h (headers) field holds {pairs!r}, not [[str, bytes or "
                           "nil], ...]")
    own = {
        "offset": offset,
        "key": fields.get(b"k"),
        "value": fields.get(b"v"),
        "headers": dict(pairs),
        "timestamp_ms": int(fields[b"t"]),
        "header_list": pairs,
    }
    return own if head is None else {"topic": head[0], "partition": head[1], **own}


def _header_pairs(pairs: Any) -> bool:
    """Whether unpacked headers are what the appends write: (name, value) pairs of a str and
    bytes or None (a msgpack map, text values or bytes names decoded as records of the wrong
    types)."""
    return type(pairs) is tuple and all(
        type(p) is tuple and len(p) == 2 and type(p[0]) is str
        and (p[1] is None or type(p[1]) is bytes) for p in pairs)
