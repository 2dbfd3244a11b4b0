"""Stream entries to Records and XINFO STREAM to log offsets: the read path's hot loop.

A fetch of 500 records spends most of its client time here, so the loop is written for speed:
each entry arrives from redis-py as ``(id, {field: value})`` (its XRANGE reply callback already
paired the fields), and a ``Record`` is built by filling a fresh instance's ``__dict__`` instead
of calling the frozen dataclass's ``__init__``, which sets each field through
``object.__setattr__`` and costs about twice as much. The result is an ordinary ``Record``
(equal to, and indistinguishable from, one built by its constructor); ``tests/test_topics.py``
checks that. Entry fields (``lua/topic_append*.lua``): ``t`` timestamp ms, ``v`` value, ``k``
key, ``h`` msgpack'd header pairs; a missing ``v`` or ``k`` is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from ._base import Record

_new = object.__new__
_set = object.__setattr__
_unpack = msgpack.unpackb

if hasattr(Record, "__slots__"):  # pragma: no cover - a guard for a future Record change
    raise ImportError("rcoord.topics._decode fills Record.__dict__; Record must not use slots")


def decode_entries(entries: Sequence[Sequence[Any]]) -> list[Record]:
    """Records of XRANGE entries ``(b"0-<offset + 1>", fields)``, in order.

    ``fields`` is a dict when redis-py's reply callback ran (a standalone client) and the flat
    ``[name, value, ...]`` list when it did not (a cluster transaction runs only the cluster
    callbacks); the flat form is paired first.
    """
    if entries and not isinstance(entries[0][1], dict):
        entries = [(e[0], dict(zip(e[1][::2], e[1][1::2]))) for e in entries]
    out: list[Record] = []
    append = out.append
    for entry_id, fields in entries:
        raw_headers = fields.get(b"h")
        rec = _new(Record)
        _set(rec, "__dict__", {
            "offset": int(entry_id[2:]) - 1,  # ids are always "0-<seq>"
            "key": fields.get(b"k"),
            "value": fields.get(b"v"),
            "headers": {} if raw_headers is None else dict(_unpack(raw_headers, raw=False)),
            "timestamp_ms": int(fields[b"t"]),
        })
        append(rec)
    return out


def _seq(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2])


def log_offsets_of(info: Mapping[Any, Any] | Sequence[Any]) -> tuple[int, int]:
    """(log start, log end) from an ``XINFO STREAM`` reply (as ``topic_common.lua``).

    The end is the sequence of ``last-generated-id``, which trimming keeps; the start is the
    first entry's offset, or the end when retention emptied the stream. The reply is a flat
    list or a dict, with str or bytes names, depending on which redis-py callback ran.
    """
    pairs = info.items() if isinstance(info, Mapping) else zip(info[::2], info[1::2])
    fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in pairs}
    end = _seq(fields["last-generated-id"])
    first = fields.get("first-entry")
    if not first or first[0] is None:
        return end, end
    return _seq(first[0]) - 1, end
