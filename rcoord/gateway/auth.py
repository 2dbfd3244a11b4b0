"""SASL/PLAIN authentication on the Kafka listener (SaslHandshake v1 + SaslAuthenticate, or
SaslHandshake v0 + a raw token).

With ``--auth-file`` every connection must authenticate, in the order Kafka's
``SaslServerAuthenticator`` allows (``dispatch`` enforces it): ApiVersions at most once, and
only before SaslHandshake; SaslHandshake once; then SaslAuthenticate. Any other request first,
or ApiVersions again, closes the connection unanswered; ApiVersions or SaslHandshake after the
handshake is answered ILLEGAL_SASL_STATE, then the connection is closed. A failed
SaslAuthenticate is answered SASL_AUTHENTICATION_FAILED, then the connection is closed. After
SaslHandshake v0 the next frame is the PLAIN token itself, with no request header (Kafka's
``handleSaslToken`` without SaslAuthenticate headers): accepted, it is answered with an empty
frame (``PlainSaslServer``'s empty challenge); refused, the connection is closed unanswered,
as Kafka has no error to send there. Every
such refusal is answered ``failed_authentication_delay_ms`` late (Kafka's
``connection.failed.authentication.delay.ms``, 100 ms), so one client cannot try passwords as
fast as the round trips go. A connection that has not authenticated is closed once it is
``connections_max_idle_ms`` old (``server``). The users come from a JSON file::

    {"users": {"alice": "alice-secret", "bob": "bob-secret"}}

Only the gateway holds the Redis credentials; clients hold Kafka credentials. The file holds
passwords in clear, so keep it readable by the gateway's user only. Passwords are compared in
constant time.

The same file may hold Kafka ACLs (``"acls": [...]``, ``"super_users": ["User:admin"]``; see
``rcoord.gateway.acl``). With an ``acls`` key, even an empty list, every action needs a rule
that allows it; without one, any authenticated user may do everything.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import Errors
from .acl import Authorizer, parse_acls
from .registry import api
from .state import Connection

__all__ = ["AuthConfig", "load_auth_file", "raw_token", "refuse"]

log = logging.getLogger("rcoord.gateway")

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
MECHANISMS = ("PLAIN",)


@dataclass(frozen=True)
class AuthConfig:
    """Who may connect: user name -> password (SASL/PLAIN); what they may do (None: all)."""

    users: dict[str, str]
    authorizer: Authorizer | None = None
    failed_authentication_delay_ms: int = 100
    """How late a failed authentication is answered (and the connection closed): Kafka's
    ``connection.failed.authentication.delay.ms``, default 100."""

    def __post_init__(self) -> None:
        if self.failed_authentication_delay_ms < 0:
            raise ValueError("failed_authentication_delay_ms must be >= 0, got "
                             f"{self.failed_authentication_delay_ms}")

    def check(self, user: str, password: str) -> bool:
        expected = self.users.get(user)
        # Compare even for an unknown user, so timing does not tell which names exist.
        ok = hmac.compare_digest((expected or "\0").encode(), password.encode())
        return expected is not None and ok


def load_auth_file(path: str | Path) -> AuthConfig:
    """Read ``--auth-file``; ValueError saying what is wrong with it."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the auth file {path}: {exc}") from None
    users = data.get("users") if isinstance(data, dict) else None
    if not isinstance(users, dict) or not users or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in users.items()):
        raise ValueError(f'the auth file {path} needs {{"users": {{"name": "password", ...}}}} '
                         "with at least one user, names and passwords non-empty strings")
    unknown = set(data) - {"users", "acls", "super_users"}
    if unknown:
        raise ValueError(f"the auth file {path} has unknown key(s) {', '.join(sorted(unknown))}"
                         "; expected users, acls, super_users")
    authorizer = None
    if "acls" in data:
        supers = data.get("super_users", [])
        if not isinstance(supers, list) or not all(
                isinstance(s, str) and s.startswith("User:") for s in supers):
            raise ValueError(f"the auth file {path}: super_users must be a list of "
                             "'User:<name>'")
        try:
            authorizer = Authorizer(parse_acls(data["acls"]), supers)
        except ValueError as exc:
            raise ValueError(f"the auth file {path}: {exc}") from None
    elif "super_users" in data:
        raise ValueError(f"the auth file {path}: super_users without acls means nothing; "
                         "add \"acls\": [] to deny everyone else by default")
    return AuthConfig(dict(users), authorizer)


_Answer = TypeVar("_Answer")


async def refuse(conn: Connection, response: _Answer) -> _Answer:
    """``response``, a refused authentication, as the connection's last answer, given after
    the auth config's ``failed_authentication_delay_ms``: Kafka's ``Selector`` holds a failed
    channel's answer and close that long. Only this connection's task waits."""
    conn.close_after_response = True
    auth = conn.state.auth
    if auth is not None and auth.failed_authentication_delay_ms > 0:
        await asyncio.sleep(auth.failed_authentication_delay_ms / 1000)
    return response


@api(SASL_HANDSHAKE, "SaslHandshake", 0, 1)
async def sasl_handshake(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    if conn.state.auth is None or conn.principal is not None:
        return {"error_code": ILLEGAL_SASL_STATE, "mechanisms": list(MECHANISMS)}
    if req.mechanism not in MECHANISMS:
        return await refuse(conn, {"error_code": UNSUPPORTED_SASL_MECHANISM,
                                   "mechanisms": list(MECHANISMS)})
    conn.sasl_mechanism = req.mechanism
    conn.sasl_raw_token = version == 0
    return {"error_code": Errors.NONE, "mechanisms": list(MECHANISMS)}


@api(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2)
async def sasl_authenticate(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    auth = conn.state.auth
    if auth is None or conn.principal is not None:
        # Kafka's KafkaApis answers it there, the connection staying open.
        return {"error_code": ILLEGAL_SASL_STATE, "auth_bytes": b"", "session_lifetime": 0,
                "error_message": "SaslAuthenticate request received after successful "
                                 "authentication" if auth is not None else
                                 "this listener does not authenticate (no --auth-file)"}
    if conn.sasl_mechanism is None:
        return await refuse(conn, {"error_code": ILLEGAL_SASL_STATE,
                                   "error_message": "no SASL handshake before",
                                   "auth_bytes": b"", "session_lifetime": 0})
    if not _plain_login(conn, auth, bytes(req.auth_bytes)):
        return await refuse(conn, {
            "error_code": SASL_AUTHENTICATION_FAILED,
            "error_message": "Authentication failed: invalid username or password",
            "auth_bytes": b"", "session_lifetime": 0})
    return {"error_code": Errors.NONE, "error_message": None, "auth_bytes": b"",
            "session_lifetime": 0}


async def raw_token(conn: Connection, token: bytes) -> bytes | None:
    """The answer to the frame after SaslHandshake v0, the PLAIN token itself: an empty frame
    once it logs in, else none and the connection closed (v0 has no frame to carry an error,
    so Kafka's client sees only the close)."""
    conn.sasl_raw_token = False
    assert conn.state.auth is not None  # (SaslHandshake succeeds only with an auth file)
    if not _plain_login(conn, conn.state.auth, token):
        return await refuse(conn, None)
    return b""


def _plain_login(conn: Connection, auth: AuthConfig, token: bytes) -> bool:
    """Log ``conn`` in with the PLAIN ``token`` (RFC 4616: [authzid] NUL authcid NUL passwd),
    whichever SaslHandshake version carried it; False (logged) if refused."""
    parts = token.split(b"\0")
    user = password = ""
    if len(parts) == 3:
        authzid, user_b, password_b = parts
        try:
            user, password = user_b.decode(), password_b.decode()
        except UnicodeDecodeError:
            user = ""
        if authzid and authzid != user_b:
            user = ""  # acting for another user is not allowed
    if not user or not auth.check(user, password):
        log.warning("SASL/PLAIN authentication failed from %s for user %r", conn.client_host,
                    user)
        return False
    conn.principal = f"User:{user}"
    return True
