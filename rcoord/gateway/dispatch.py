"""One request frame in, one response frame out (or none), by the rules of Kafka's broker.

* ApiVersions at a version the gateway does not serve is answered at version 0 with
  UNSUPPORTED_VERSION and the supported ranges, so the client can pick (KIP-511's rule).
* Any other API Kafka defines, at a version kio can encode but this gateway does not serve
  (or an API it does not serve at all), is answered with UNSUPPORTED_VERSION in that
  response's error code; the connection stays open.
* A request that cannot be parsed, or an API key or version no schema describes, cannot be
  answered (there is no response layout to use): the connection is closed with a log line,
  which is what Kafka's broker does with an unparseable request.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.index import KioIndexError

from ..errors import ConnectionLost, Errors, InvalidRequestError, ProtocolError
from . import (  # noqa: F401  (each registers its APIs)
    api_admin,
    api_configs,
    api_groups,
    api_meta,
    api_offsets,
    api_producers,
    api_records,
    api_topics,
    auth,
)
from .errors import RequestError
from .framing import FrameError
from .registry import REGISTRY
from .state import Connection
from .wire import decode_body, encode_response, error_response, parse_header_prefix

__all__ = ["API_VERSIONS", "handle_frame"]

log = logging.getLogger("rcoord.gateway")

API_VERSIONS = 18
_BEFORE_AUTH = frozenset({API_VERSIONS, auth.SASL_HANDSHAKE, auth.SASL_AUTHENTICATE})
"""What a connection may send before it authenticated (with ``--auth-file``)."""


async def handle_frame(conn: Connection, frame: bytes) -> bytes | None:
    """The response frame body for the request ``frame`` (None: no response is due).

    Raises FrameError when the connection must close.
    """
    try:
        head = parse_header_prefix(frame)
    except ValueError as exc:
        raise FrameError(str(exc)) from None
    key, version, corr = head.api_key, head.api_version, head.correlation_id
    if conn.state.auth is not None and conn.principal is None and key not in _BEFORE_AUTH:
        raise FrameError(f"API key {key} before SASL authentication")
    entry = REGISTRY.get(key)
    if entry is None or not entry.min_version <= version <= entry.max_version:
        if key == API_VERSIONS:
            data = await REGISTRY[API_VERSIONS].handler(conn, None, 0)
            assert data is not None
            data["error_code"] = Errors.UNSUPPORTED_VERSION
            return encode_response(key, 0, corr, data)
        try:
            body = error_response(key, version, Errors.UNSUPPORTED_VERSION)
            log.info("API key %d v%d is not served; answered UNSUPPORTED_VERSION", key, version)
            return encode_response(key, version, corr, body)
        except KioIndexError:
            raise FrameError(f"no Kafka schema for API key {key} version {version}") from None
    try:
        client_id, request = decode_body(key, version, frame)
    except Exception as exc:  # noqa: BLE001  (any parse failure: not this request)
        raise FrameError(f"cannot parse {entry.name} v{version}: {exc}") from None
    conn.client_id = client_id or ""
    response: dict[str, Any] | None
    try:
        response = await entry.handler(conn, request, version)
    except RequestError as exc:
        response = error_response(key, version, exc.code)
    except ProtocolError as exc:  # e.g. a TopicError: the code Kafka would send
        response = error_response(key, version, exc.error)
    except (InvalidRequestError, TypeError, ValueError) as exc:  # rcoord's argument checks
        log.info("%s v%d refused: %s", entry.name, version, exc)
        response = error_response(key, version, Errors.INVALID_REQUEST)
    except ConnectionLost as exc:  # (ServerUnavailable too: Redis answered "not now")
        log.warning("%s v%d: Redis unreachable or unavailable: %s", entry.name, version, exc)
        code = Errors.COORDINATOR_NOT_AVAILABLE if entry.group else Errors.UNKNOWN_SERVER_ERROR
        response = error_response(key, version, code)
    except Exception:
        log.exception("%s v%d failed", entry.name, version)
        response = error_response(key, version, Errors.UNKNOWN_SERVER_ERROR)
    if response is None:
        return None
    return encode_response(key, version, corr, response)
