"""One request frame in, one response frame out (or none), by the rules of Kafka's broker.

* ApiVersions at a version the gateway does not serve is answered at version 0 with
  UNSUPPORTED_VERSION and the supported ranges, so the client can pick (KIP-511's rule).
* Any other API Kafka defines, at a version kio can encode but this gateway does not serve
  (or an API it does not serve at all), is answered with UNSUPPORTED_VERSION in that
  response's error code; the connection stays open.
* A request that cannot be parsed, or an API key or version no schema describes, cannot be
  answered (there is no response layout to use): the connection is closed with a log line,
  which is what Kafka's broker does with an unparseable request.
* A request that fails as a whole (a handler's RequestError, Redis unreachable or refusing
  writes) is answered as Kafka's ``AbstractRequest.getErrorResponse``: the error on every
  partition, topic, group or resource the request named (``error_responses``), never an empty
  response a client would read as success. Where the request names nothing to carry the error,
  and for a Produce with acks=0 (no response is ever sent), the connection is closed.
* A Fetch that fails as a whole is answered no sooner than its ``max_wait`` (at most a
  second) after it came, as an empty one would be: clients that do not back off from a
  Fetch's errors (kafka-python) would otherwise fetch again hundreds of times a second.
* With an auth file, requests before authentication follow Kafka's SaslServerAuthenticator
  (``_before_authentication``); the frame after SaslHandshake v0 is a SASL token, not a
  request (``auth.raw_token``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.index import KioIndexError

from ..errors import (
    Errors,
    InvalidRequestError,
    ProtocolError,
    as_missing_permission,
    is_missing_permission,
)
from . import (  # noqa: F401  (each registers its APIs)
    api_admin,
    api_alter_configs,
    api_configs,
    api_delete_records,
    api_groups,
    api_meta,
    api_offsets,
    api_producers,
    api_records,
    api_topics,
    auth,
)
from .error_responses import UNAVAILABLE, request_error_response
from .errors import UNREACHED, RequestError, log_unreached, since_last, throttled
from .framing import FrameError
from .registry import REGISTRY
from .state import Connection
from .wire import decode_body, encode_response, millis, parse_header_prefix

__all__ = ["API_VERSIONS", "handle_frame"]

log = logging.getLogger("rcoord.gateway")

API_VERSIONS = 18
FETCH = 1

FAILED_FETCH_HOLD_MAX_MS = 1000
"""The longest a Fetch failed as a whole is held before its answer (``_hold_failed_fetch``)."""


def _before_authentication(conn: Connection, key: int, served: bool) -> bool:
    """May request ``key`` (at a version the gateway serves, or not) come now, before the
    connection has authenticated? Kafka's ``SaslServerAuthenticator``: ApiVersions or
    SaslHandshake first, ApiVersions only once (one answered UNSUPPORTED_VERSION does not
    count: the client asks again at a version it can use), then SaslHandshake, then only
    SaslAuthenticate. True: handle it; False: answer it ILLEGAL_SASL_STATE and close (a request
    after the handshake other than SaslAuthenticate, as Kafka's ``handleSaslToken``, which
    answers any request it can parse with that request's error response); a FrameError closes
    the connection unanswered (anything before the handshake out of that order, as Kafka closes
    it on the IllegalSaslStateException or IllegalStateException of ``handleKafkaRequest``;
    and ApiVersions or SaslHandshake after it at a version not served)."""
    if conn.sasl_mechanism is not None:
        if key == auth.SASL_AUTHENTICATE:
            return True
        if key not in (API_VERSIONS, auth.SASL_HANDSHAKE) or served:
            return False
    elif key in (auth.SASL_HANDSHAKE, auth.SASL_AUTHENTICATE):
        return True  # (SaslAuthenticate answers ILLEGAL_SASL_STATE itself)
    elif key == API_VERSIONS and not conn.api_versions_answered:
        conn.api_versions_answered = served
        return True
    raise FrameError(f"API key {key} out of the SASL authentication's order (ApiVersions "
                     "at most once, SaslHandshake, SaslAuthenticate)")


async def handle_frame(conn: Connection, frame: bytes) -> bytes | None:
    """The response frame body for the request ``frame`` (None: no response is due).

    Raises FrameError when the connection must close.
    """
    if conn.sasl_raw_token:
        return await auth.raw_token(conn, frame)
    try:
        head = parse_header_prefix(frame)
    except ValueError as exc:
        raise FrameError(str(exc)) from None
    key, version, corr = head.api_key, head.api_version, head.correlation_id
    entry = REGISTRY.get(key)
    if conn.state.auth is not None and conn.principal is None and not _before_authentication(
            conn, key, entry is not None and entry.min_version <= version <= entry.max_version):
        what = f"API key {key} v{version} during SASL authentication, before SaslAuthenticate"
        try:
            refused = decode_body(key, version, frame)[1]
        except Exception:  # noqa: BLE001  (Kafka's parseRequest fails: closed unanswered)
            raise FrameError(f"{what}, and it does not parse") from None
        answer = _error_answer(key, version, corr, refused, auth.ILLEGAL_SASL_STATE, what)
        return await auth.refuse(conn, answer)
    if entry is None or not entry.min_version <= version <= entry.max_version:
        if key == API_VERSIONS:
            data = await REGISTRY[API_VERSIONS].handler(conn, None, 0)
            assert data is not None
            data["error_code"] = Errors.UNSUPPORTED_VERSION
            return encode_response(key, 0, corr, data)
        try:
            unserved = decode_body(key, version, frame)[1]
        except Exception:  # noqa: BLE001  (then only a top-level code can be answered)
            unserved = None
        answer = _error_answer(key, version, corr, unserved, Errors.UNSUPPORTED_VERSION,
                               f"API key {key} v{version} is not served")
        log.info("API key %d v%d is not served; answered UNSUPPORTED_VERSION", key, version)
        return answer
    try:
        client_id, request = decode_body(key, version, frame)
    except Exception as exc:  # noqa: BLE001  (any parse failure: not this request)
        raise FrameError(f"cannot parse {entry.name} v{version}: {exc}") from None
    conn.client_id = client_id or ""
    response: dict[str, Any] | None
    code: int
    started = asyncio.get_running_loop().time()
    try:
        response = await entry.handler(conn, request, version)
    except RequestError as exc:
        code = exc.code
    except ProtocolError as exc:  # e.g. a TopicError: the code Kafka would send
        code = exc.error
    except (InvalidRequestError, TypeError, ValueError) as exc:  # rcoord's argument checks
        log.info("%s v%d refused: %s", entry.name, version, exc)
        code = Errors.INVALID_REQUEST
    except UNREACHED as exc:
        # (ServerUnavailable too: Redis answered "not now"; and a redis-py error no rcoord
        # boundary translated, such as no free connection in the pool: retriable, not -1)
        log_unreached(conn.state, f"{entry.name} v{version}", exc)
        code = (Errors.COORDINATOR_NOT_AVAILABLE if entry.group
                else UNAVAILABLE.get(key, Errors.UNKNOWN_SERVER_ERROR))
    except Exception as exc:
        if is_missing_permission(exc):
            _missing_permission(conn, entry.name, version, exc)
        else:
            log.exception("%s v%d failed", entry.name, version)
        code = Errors.UNKNOWN_SERVER_ERROR
    else:
        if response is None:
            return None
        if entry.offload:  # possibly seconds of work: not on the event loop
            return await conn.state.blocking(encode_response, key, version, corr, response)
        return encode_response(key, version, corr, response)
    if key == FETCH:
        await _hold_failed_fetch(request, started)
    if key == 0 and getattr(request, "acks", None) == 0:
        # Kafka closes an acks=0 producer's connection on an error: its only way to tell.
        raise FrameError(f"Produce with acks=0 failed (error code {code})")
    return _error_answer(key, version, corr, request, code,
                         f"{entry.name} v{version} failed with error code {code}")


async def _hold_failed_fetch(request: Any, started: float) -> None:
    """Hold the answer of a Fetch that failed as a whole (Redis refused the gateway's login or
    its user a command, Redis unreachable) until the request's ``max_wait`` has passed since it
    came, at most ``FAILED_FETCH_HOLD_MAX_MS``: as an empty Fetch would have waited. Answered at
    once, a kafka-python consumer fetched again at once (it backs off only from a failed
    connection, not from a partition's error), about 700 Fetches a second per consumer, each
    a Redis round trip and a log line, for as long as the failure lasted (librdkafka backs
    off itself, ``fetch.error.backoff.ms``). Clients wait ``max_wait`` for a Fetch's answer
    in any case, so holding it costs none of them a timeout. A Fetch that already waited its
    ``max_wait`` is answered at once."""
    wait_ms = min(max(0, millis(getattr(request, "max_wait", 0))), FAILED_FETCH_HOLD_MAX_MS)
    left_s = started + wait_ms / 1000 - asyncio.get_running_loop().time()
    if left_s > 0:
        await asyncio.sleep(left_s)


def _missing_permission(conn: Connection, name: str, version: int, exc: Exception) -> None:
    """Log a request the gateway's own Redis user was refused (NOPERM, "ACL failure in
    script"): one error line naming the rule to add the first time each refusal is met, again
    at most every ``MISSING_PERMISSION_LOG_INTERVAL_S`` while it lasts (with the number of
    requests it failed since), and a debug line for each of the others. Before, each such
    request logged a full traceback (every Fetch of a polling consumer: several a second),
    which buried the one line that says what to grant; and then, logged once per process, a
    rule granted and later removed again (an ACL file reloaded from an old copy) failed every
    request with nothing but debug lines. The request is still answered UNKNOWN_SERVER_ERROR:
    the Kafka client cannot mend the gateway's Redis rights."""
    error = as_missing_permission(exc, conn.state.config.namespace)
    message = str(error)
    count = throttled(conn.state.missing_permissions, message,
                      MISSING_PERMISSION_LOG_INTERVAL_S)
    if count is None:
        log.debug("%s v%d refused by Redis's ACL (logged before): %s", name, version, message)
        return
    log.error("%s v%d: %s; the gateway answers UNKNOWN_SERVER_ERROR to every request that "
              "needs it until the rule is added (logged again at most once a minute while it "
              "lasts)%s", name, version, message, since_last(count))


MISSING_PERMISSION_LOG_INTERVAL_S = 60.0
"""How often a refusal of the gateway's Redis user is logged again while it lasts."""


def _error_answer(key: int, version: int, corr: int, request: Any, code: int, what: str
                  ) -> bytes:
    """The response frame body giving ``code`` to all of ``request`` (``error_responses``).

    Raises FrameError, ``what`` saying why there was an error, where that cannot be answered:
    no schema, nothing in the request to carry the code, or a request this gateway's builders
    do not know the shape of. The last is a gap in rcoord, but escaping as an exception it
    left the request unanswered and asyncio logging a traceback per request; closing is what
    a client can act on (it reconnects, or picks another version)."""
    try:
        body = request_error_response(key, version, request, code)
        if body is not None:
            return encode_response(key, version, corr, body)
    except KioIndexError:
        raise FrameError(f"no Kafka schema for API key {key} version {version}") from None
    except Exception as exc:  # noqa: BLE001
        raise FrameError(f"{what}, and its error response cannot be built "
                         f"({type(exc).__name__}: {exc})") from None
    raise FrameError(f"{what}, and the request names nothing its response could carry the "
                     "error on")
