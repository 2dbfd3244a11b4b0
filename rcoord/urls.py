"""What a Redis URL given to rcoord may be, and how messages show one.

Every entry point that takes a URL (the CLIs, the worker's ``ConsumerGroupConfig``, the
coordinator's ``ServiceConfig``, the Spark ``url`` option) checks it here, so a URL one of them
refuses is refused by all, with the same words. redis-py's ``from_url`` is lenient where a typo
costs most: ``redis://host/1/2`` is database 12, ``redis://host/prod`` database 0, and a misspelt
query argument (``socket_timout``) reaches the connection and fails the first command with a
``TypeError``; a worker with such a URL would wait in an empty database for ever.

A URL carries a password, so messages show it through ``redact_url`` only, and a parse error's
own text (which may quote part of the password) is not shown when the URL has one.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["URL_FORM", "redact_url", "repr_redacting", "url_problem"]

URL_FORM = "redis://[USER:PASSWORD@]HOST:PORT[/DB] or rediss://... for TLS"
"""What a URL looks like, for error messages."""

_SCHEMES = ("redis", "rediss", "unix")


def url_problem(url: object) -> str | None:
    """What is wrong with ``url`` (words to follow the URL in a message), or None."""
    from redis.connection import parse_url

    if not isinstance(url, str) or not url:
        return f"is not a Redis URL; write {URL_FORM}"
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        return f"is not a Redis URL; write {URL_FORM}"
    encode = ("a '/', '?', '#' or '@' in the user name or password must be percent-encoded: "
              "%2F, %3F, %23, %40")
    # (the '@' ending a user info: not one of a query value that redis-py reads as the value's)
    at = _last_at(rest, functools.partial(_in_option_value, scheme.lower()))
    try:
        options = parse_url(url)
    except ValueError as exc:  # (its text may quote part of a password)
        return f"is not a Redis URL ({encode if at >= 0 else exc}); write {URL_FORM}"
    parts = urlsplit(url)
    if at >= 0 and "@" not in parts.netloc:  # the password's '/' cut the authority short
        return f"is not a Redis URL ({encode}); write {URL_FORM}"
    if parts.scheme in ("redis", "rediss") and not parts.hostname:
        # (redis-py connects to localhost: redis://${REDIS_HOST}:6379 with the variable unset
        # reached whatever Redis ran on the worker's own machine)
        return ("the host is missing (redis-py would connect to localhost); write "
                "redis://HOST:PORT[/DB]")
    if parts.scheme == "unix" and parts.path in ("", "/"):
        return "the socket path is missing; write unix:///PATH/TO/redis.sock[?db=DB]"
    if parts.scheme in ("redis", "rediss") and parts.path not in ("", "/") \
            and not re.fullmatch(r"/\d+", parts.path):
        return (f"the path {parts.path!r} is not a database number; write "
                "redis://HOST:PORT/DB with DB a number (0 when left out)")
    unknown = sorted(set(options) - _connection_options(options.get("connection_class")))
    tls = [u for u in unknown if u in _connection_options(_ssl_connection())]
    if tls and parts.scheme != "rediss":
        # (said as a misspelling, with the very name given as an example of a right one)
        verb, pronoun = ("is a TLS option", "it") if len(tls) == 1 else ("are TLS options", "them")
        return (f"{', '.join(repr(u) for u in tls)} {verb}, for a rediss:// URL only; "
                f"write rediss://... to connect with TLS, or drop {pronoun}")
    if unknown:
        verb = "is not a connection option" if len(unknown) == 1 else \
            "are not connection options"
        return (f"{', '.join(repr(u) for u in unknown)} {verb}"
                " (check the spelling; e.g. socket_timeout, socket_connect_timeout, "
                "health_check_interval, client_name, ssl_cert_reqs, ssl_ca_certs)")
    return None


def _last_at(rest: str, in_value: Callable[[str], bool]) -> int:
    """The index in ``rest`` (a URL after its ``://``) of the last ``@`` for which
    ``in_value(text before it)`` is false, or -1: the ``@`` that ends the user info."""
    at = len(rest)
    while (at := rest.rfind("@", 0, at)) >= 0 and in_value(rest[:at]):
        pass
    return at


_HEAD = {  # (what may come before a query whose value holds an '@', by scheme: a host name
    # or [IPv6], a port and database of digits, a unix socket's path; a user info before them)
    "unix": re.compile(r"(?:[^/?#@]*@)?/[^?#@]*"),
    "redis": re.compile(r"(?:[^/?#@]*@)?(?:\[[\w:.%]+\]|[\w.%-]+)(?::\d+)?(?:/\d*)?"),
}


def _in_option_value(scheme: str, before: str) -> bool:
    """Whether the text after ``before`` is inside the value of a query argument redis-py reads
    (one of a connection's options). redis-py's authority ends at the first ``/``, ``?`` or
    ``#``, so ``redis://h:1/0?client_name=a@b`` names host ``h``; but so read, a password
    holding a raw ``?`` reads as a host, its tail as a query (``redis://u:12?x=y@h`` connects to
    ``u:12``). So the ``@`` is taken for the value's only where a password is the less likely
    reading: what comes before the ``?`` is a host (``[USER:PASSWORD@]HOST[:PORT][/DB]``; a
    unix URL's path), no ``#`` comes before the ``@``, and the argument is an option redis-py
    takes. Elsewhere the ``@`` still ends the user info (``url_problem`` asks for the password
    to be percent-encoded)."""
    head, mark, query = before.partition("?")
    if not mark or "#" in query:
        return False
    if not _HEAD["unix" if scheme == "unix" else "redis"].fullmatch(head):
        return False
    name, eq, _ = query.split("&")[-1].partition("=")
    options = _connection_options(None) | _connection_options(_ssl_connection())
    return bool(eq) and unquote(name.replace("+", " ")) in options


def _ssl_connection() -> Any:
    """redis-py's TLS connection class (what ``rediss://`` makes)."""
    from redis.connection import SSLConnection

    return SSLConnection


@functools.cache
def _connection_options(connection_class: Any) -> frozenset[str]:
    """The keyword arguments a redis-py connection of ``connection_class`` (None: a TCP one)
    takes, its base classes' included, and the URL keys that are not passed to it: the pool
    reads ``connection_class`` and ``max_connections`` (docs/gateway.md tells operators to size
    the pool with ``?max_connections=N``, which every URL check refused as a misspelling).
    Cached: every config and Spark reader checks its URL, and the signatures do not change."""
    from redis.connection import Connection

    names = {"connection_class", "max_connections"}
    for cls in (connection_class or Connection).__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            names.update(p.name for p in inspect.signature(init).parameters.values()
                         if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return frozenset(names - {"self"})


def redact_url(url: object, *, query: bool = False) -> str:
    """``url`` as messages show it: no password, nothing else of what comes before the host's
    ``@`` but the user name, and no query arguments, however malformed the URL is; with
    ``query``, the query arguments are kept, the value of any that names a password
    (``?password=``, ``?ssl_password=``) masked. A message about the URL the user gave
    (``cli.check_url``) keeps them: "'socket_timout' is not a connection option" quoted a URL
    that had none. Others drop them (the URL a command connects with carries the TLS file
    arguments ``--tls-ca-file`` added, which the user did not write).

    The cut is the last ``@`` outside a query argument's password (``_in_query_password``)
    and outside a value ``url_problem`` reads as the value's (``_in_option_value``), not a
    parser's: a raw ``/``, ``?`` or ``#`` in a password ends the authority early for
    ``urlsplit``, which then finds no password at all (the whole URL was shown). A URL whose
    ``@`` might belong to either is masked, the safe side. The ``@`` of a ``?password=``
    value is not one: that value is masked whole (or dropped with the query), and cut there,
    the password's tail was shown as the host ('redis://h:***@TAIL'); nor is one of
    ``?client_name=a@b`` after a host, which was shown as 'redis://h:***@b', a host the URL
    does not name. Where the URL is well formed (``url_problem`` takes it), this is urllib's
    cut (the last ``@`` of the authority), the host redis-py reads."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    masked = ""
    at = _last_at(rest, lambda before: _in_query_password(before)
                  or _in_option_value(scheme.lower(), before))
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1:]
        masked = f"{userinfo.split(':', 1)[0]}:***@" if ":" in userinfo else "***@"
    if not query:
        return f"{scheme}{sep}{masked}{re.split(r'[?#]', rest, maxsplit=1)[0]}"
    where, mark, args = rest.partition("?")
    return f"{scheme}{sep}{masked}{where}{mark}{_masked_query(args)}"


def _in_query_password(before: str) -> bool:
    """Whether the text after ``before`` is inside the value of a query argument whose name
    holds "password" (one ``_masked_query`` masks): after a ``?``, the last ``?``- or
    ``&``-separated piece of ``before`` is ``NAME=...``. (A password before the host that
    itself holds "?password=" is read so too: its part before the "?" is then shown.)"""
    if "?" not in before:
        return False
    name, eq, _ = re.split(r"[?&]", before)[-1].partition("=")
    return bool(eq) and "password" in unquote(name).lower()


def _masked_query(query: str) -> str:
    """A URL's query (and fragment) as ``redact_url`` shows it: the value of an argument whose
    name holds "password" masked to the next ``&``, so a raw ``#`` in it hides nothing."""
    shown = []
    for arg in query.split("&"):
        name, eq, _ = arg.partition("=")
        shown.append(f"{name}{eq}***" if eq and "password" in unquote(name).lower() else arg)
    return "&".join(shown)


def repr_redacting(obj: Any, url_field: str) -> str:
    """A dataclass's repr with its URL field shown through ``redact_url``: a config's repr
    lands in logs and tracebacks, and the URL holds the password."""
    shown = []
    for f in dataclasses.fields(obj):
        if f.repr:
            value = getattr(obj, f.name)
            if f.name == url_field and value is not None:
                value = redact_url(value)
            shown.append(f"{f.name}={value!r}")
    return f"{type(obj).__qualname__}({', '.join(shown)})"
