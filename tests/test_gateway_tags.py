"""Tagged fields a request's schema does not name are ignored, as Kafka's broker ignores them
(KIP-482: ``Readable.readUnknownTaggedField`` keeps their bytes); kio refused them and the
gateway closed the connection unanswered."""

from __future__ import annotations

import dataclasses
import functools
import io
from typing import Any

import pytest
from gateway_harness import connect, request_frame, response, running_gateway
from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
)

from rcoord.gateway.registry import REGISTRY
from rcoord.gateway.tags import drop_unknown_tags
from rcoord.gateway.wire import _zero, build, decode_body, request_class

UNKNOWN_TAG = 4000
"""A tag no schema names."""


def _sample(cls: Any) -> dict[str, Any]:
    """Plain data for ``cls`` with one element in every array (so every nested struct is on the
    wire) and zeros elsewhere."""
    data: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = classify_field(f)
        if isinstance(kind, EntityTupleField):
            data[f.name] = [_sample(kind.type_)]
        elif isinstance(kind, EntityField):
            data[f.name] = _sample(kind.type_)
        elif isinstance(kind, PrimitiveTupleField):
            data[f.name] = [_zero(kind.type_)]
    return data


@functools.cache
def _tagged_twin(cls: Any) -> Any:
    """``cls`` with one more tagged field, ``UNKNOWN_TAG`` (its nested structs likewise), so
    kio's own writer puts an unknown tagged field in every struct of a flexible version."""
    fields: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        kind = classify_field(f)
        tp = f.type
        if isinstance(kind, EntityTupleField):
            tp = tuple[_tagged_twin(kind.type_), ...]  # type: ignore[misc]
        elif isinstance(kind, EntityField):
            tp = _tagged_twin(kind.type_) | None if f.type != kind.type_ else _tagged_twin(
                kind.type_)
        fields.append((f.name, tp, dataclasses.field(
            default=f.default, default_factory=f.default_factory, metadata=f.metadata)))
    if cls.__flexible__:
        fields.append(("unknown", bytes, dataclasses.field(
            default=b"", metadata={"kafka_type": "bytes", "tag": UNKNOWN_TAG})))
    return dataclasses.make_dataclass(cls.__name__, fields, frozen=True, kw_only=True, namespace={
        "__flexible__": cls.__flexible__})


def _twin_of(entity: Any) -> Any:
    twin = _tagged_twin(type(entity))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            value = tuple(_twin_of(v) for v in value)
        elif dataclasses.is_dataclass(value):
            value = _twin_of(value)
        values[f.name] = value
    if type(entity).__flexible__:
        values["unknown"] = b"zz"
    return twin(**values)


def _frame(header: Any, body: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(header))(buf, header)
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def _served_flexible() -> list[tuple[int, int]]:
    return [(key, v) for key, api in sorted(REGISTRY.items())
            for v in range(api.min_version, api.max_version + 1)
            if request_class(key, v).__flexible__]


@pytest.mark.parametrize(("api_key", "version"), _served_flexible())
def test_every_served_flexible_request_reads_as_without_the_unknown_tags(api_key, version):
    cls = request_class(api_key, version)
    header = build(cls.__header_schema__, {
        "request_api_key": api_key, "request_api_version": version, "correlation_id": 7,
        "client_id": "tags"})
    body = build(cls, _sample(cls))
    plain = _frame(header, body)
    tagged = _frame(_twin_of(header), _twin_of(body))
    assert tagged.count(b"zz") > plain.count(b"zz")  # (the unknown fields are on the wire)
    assert drop_unknown_tags(plain, cls.__header_schema__, cls) == plain  # walked exactly
    assert drop_unknown_tags(tagged, cls.__header_schema__, cls) == plain
    assert decode_body(api_key, version, tagged) == ("tags", body)
    assert decode_body(api_key, version, tagged + b"\x01\x02") == ("tags", body)  # (trailing)


def test_a_frame_cut_inside_a_field_is_still_refused():
    cls = request_class(8, 8)  # OffsetCommit v8
    header = build(cls.__header_schema__, {"request_api_key": 8, "request_api_version": 8,
                                           "correlation_id": 1, "client_id": "c"})
    tagged = _frame(_twin_of(header), _twin_of(build(cls, _sample(cls))))
    with pytest.raises(ValueError, match="ends inside a field"):
        drop_unknown_tags(tagged[:-6], cls.__header_schema__, cls)
    with pytest.raises(ValueError, match="ends inside a field"):
        decode_body(8, 8, tagged[:-6])


def test_a_heartbeat_with_unknown_tags_is_answered(redis_server, namespace):
    """Heartbeat v4, byte for byte, with a tag no schema names in its header or its body, is
    answered as without it (the connection was closed unanswered)."""
    frame = request_frame(12, 4, 5, {"group_id": "g", "generation_id": 1, "member_id": "m"})
    body = frame[4:]
    # header v2: key, version, correlation id (8 bytes), client id "raw" (2 + 3), then the
    # header's tagged-field count; the body's count is its last byte
    codes = []
    with running_gateway(redis_server, namespace) as gw:
        for at in (None, 13, len(body) - 1):
            sent = body
            if at is not None:
                assert body[at] == 0
                sent = body[:at] + bytes([1, 99, 2]) + b"ab" + body[at + 1:]
            sock = connect(gw)
            try:
                sock.sendall(len(sent).to_bytes(4, "big") + sent)
                codes.append(response(sock, 12, 4, 5).error_code)
            finally:
                sock.close()
    assert codes == [25, 25, 25]  # UNKNOWN_MEMBER_ID: no such group, as Kafka answers
