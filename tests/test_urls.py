"""A Redis URL is checked the same way by every entry point (``rcoord.urls``), and no message or
repr shows its password.

From a reviewer's repros: a password holding a raw ``/``, ``#`` or ``?`` (base64 passwords
often hold ``/``) made ``urlsplit`` find no password, so every CLI printed the whole URL in its
error, and redis-py's own parse error quoted part of the password; the worker's, the
coordinator's and Spark's configs showed the URL in their repr and errors; and those three took
URLs the CLIs refuse (``/1/2`` is database 12 to redis-py, ``/prod`` database 0, a misspelt query
argument a ``TypeError`` at the first command)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from rcoord import ConsumerGroupConfig
from rcoord.cli import UsageError, check_url
from rcoord.errors import ConfigError
from rcoord.service import ServiceConfig
from rcoord.spark.options import OptionError, parse_read_options, parse_write_options
from rcoord.spark.plan import OffsetRange
from rcoord.spark.source import RangePartition
from rcoord.urls import redact_url, url_problem

ROOT = Path(__file__).resolve().parent.parent
SECRET = "Zm9v/YmFy+c2VjcmV0"

LEAKY = [
    f"redis://admin:{SECRET}@127.0.0.1:6379/0",  # '/' in the password
    "redis://admin:hunter#2Zm9vYmFy@127.0.0.1:6379/0",  # '#'
    "redis://:p?Zm9vYmFy@127.0.0.1:6379",  # '?'
    "redis://:ab/Zm9vYmFy@127.0.0.1:6379",  # parses, with the password's tail as the path
    "admin:Zm9vYmFy@redis.internal:6379",  # no scheme
]


def _secret_parts(url: str) -> list[str]:
    """Pieces of the URL's password long enough to matter if shown."""
    password = url.split("@")[0].split(":")[-1]
    return [p for p in password.replace("#", "/").replace("?", "/").split("/") if len(p) >= 4]


def _entry_point_errors(url: str) -> list[str]:
    """The error each entry point raises for ``url`` (each must raise)."""
    errors: list[str] = []
    attempts: list[Any] = [
        lambda: check_url(url),
        lambda: ConsumerGroupConfig(group_id="g", topics=["t"], redis_url=url),
        lambda: ServiceConfig(redis_url=url),
        lambda: parse_read_options({"url": url, "subscribe": "t"}, "batch", env={}),
        lambda: parse_write_options({"url": url, "topic": "t"}, env={}),
    ]
    for attempt in attempts:
        with pytest.raises((UsageError, ConfigError, OptionError)) as raised:
            attempt()
        errors.append(str(raised.value))
    return errors


@pytest.mark.parametrize("url", LEAKY)
def test_no_entry_point_shows_the_password_of_a_url_it_refuses(url: str) -> None:
    for message in _entry_point_errors(url):
        assert "is not a Redis URL" in message, message
        for part in _secret_parts(url):
            assert part not in message, message
    assert "***@" in redact_url(url)


@pytest.mark.parametrize("url", LEAKY[:1])
def test_a_cli_refusing_the_url_does_not_print_its_password(url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-m", "rcoord", "topics", "list", "--redis-url", url],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "percent-encoded" in res.stderr
    for part in _secret_parts(url):
        assert part not in res.stderr + res.stdout


def test_reprs_show_the_url_without_its_password() -> None:
    url = "redis://admin:Zm9vYmFy@127.0.0.1:6379/0?password=Zm9vYmFy"
    configs = [
        ConsumerGroupConfig(group_id="g", topics=["t"], redis_url=url),
        ServiceConfig(redis_url=url),
        parse_read_options({"url": url, "subscribe": "t"}, "batch", env={}),
        parse_write_options({"url": url, "topic": "t"}, env={}),
        # (a Spark task: Spark logs a failed task's partition)
        RangePartition(url, "rcoord", OffsetRange("t", 0, 0, 10), 500, True),
    ]
    for config in configs:
        shown = repr(config)
        assert "Zm9vYmFy" not in shown and "'redis://admin:***@127.0.0.1:6379/0'" in shown, shown
    # The other fields are shown as a dataclass shows them.
    assert "group_id='g'" in repr(configs[0]) and "namespace='rcoord'" in repr(configs[1])


@pytest.mark.parametrize(("suffix", "says"), [
    ("/1/2", "the path '/1/2' is not a database number"),
    ("/prod", "the path '/prod' is not a database number"),
    ("/0?socket_timout=1", "'socket_timout' is not a connection option"),
])
def test_every_entry_point_refuses_what_the_cli_refuses(suffix: str, says: str) -> None:
    """The worker, the coordinator's config and Spark took these (the CLIs refused them): a
    worker then sat in database 12 or 0, or failed its first command with a TypeError."""
    for message in _entry_point_errors(f"redis://127.0.0.1:6379{suffix}"):
        assert says in message, message


def test_every_entry_point_quotes_the_query_its_error_names() -> None:
    """The URL in a message lost its query string, so "'socket_timout' is not a connection
    option" quoted 'redis://u:***@127.0.0.1:6379/0', a URL with no such argument; the query is
    shown now, a password in it masked as the one before the host is. The CLIs' check_url did
    so first (2e6c377); the worker's, the coordinator's and Spark's configs still dropped it."""
    url = "redis://u:Zm9vYmFy@127.0.0.1:6379/0?socket_timout=1&Password=Zm9vYmFy"
    for message in _entry_point_errors(url):
        assert "'redis://u:***@127.0.0.1:6379/0?socket_timout=1&Password=***'" in message, \
            message
        assert "Zm9vYmFy" not in message, message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h:1/0?client_name=x#top", "redis://h:1/0?client_name=x#top"),
        ("rediss://h:1/0?ssl_password=ab#Zm9vYmFy&db=1", "rediss://h:1/0?ssl_password=***&db=1"),
        ("redis://h:1/0?pass%77ord=Zm9vYmFy", "redis://h:1/0?pass%77ord=***"),
        ("redis://h:1/0?password", "redis://h:1/0?password"),
        ("redis://u:Zm9vYmFy@h:1/0?password=Zm9vYmFy", "redis://u:***@h:1/0?password=***"),
    ],
)
def test_a_shown_query_masks_every_password_in_it(url: str, shown: str) -> None:
    assert redact_url(url, query=True) == shown
    assert redact_url(url) == shown.split("?")[0]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h:1/0?password=ab@Zm9vYmFy", "redis://h:1/0?password=***"),
        ("redis://u:Zm9vYmFy@h:1/0?password=ab@Zm9vYmFy&db=1",
         "redis://u:***@h:1/0?password=***&db=1"),
        ("rediss://h:1/0?db=1&ssl_password=a@b@Zm9vYmFy#x", "rediss://h:1/0?db=1&ssl_password=***"),
        ("redis://h:1/0?password=a#b@Zm9vYmFy", "redis://h:1/0?password=***"),
        ("unix:///tmp/r.sock?password=a@Zm9vYmFy", "unix:///tmp/r.sock?password=***"),
        # (a raw '?' in the password before the host, and an '@' in the query's one)
        ("redis://u:p?Zm9vYmFy@h:1/0?password=a@Zm9vYmFy", "redis://u:***@h:1/0?password=***"),
        # (two '@' before the host: the password holds the first, as urllib reads it)
        ("redis://u:Zm9v@YmFy@h:1/0?password=a@Zm9vYmFy", "redis://u:***@h:1/0?password=***"),
    ],
)
def test_an_at_in_a_query_password_does_not_end_the_user_info(url: str, shown: str) -> None:
    """The user info was cut at the last '@' of the URL, so a raw '@' in a ``?password=`` value
    made everything before it the user info and the password's tail the host:
    'redis://h:***@Zm9vYmFy' for 'redis://h:1/0?password=ab@Zm9vYmFy'. An '@' in such a value
    (masked whole, to the next '&') ends no user info now; the host is the one urllib (and so
    redis-py) reads where the URL is well formed, and no part of a password is shown."""
    assert redact_url(url, query=True) == shown
    assert redact_url(url) == shown.split("?")[0]
    assert "Zm9v" not in redact_url(url, query=True)
    if url_problem(url) is None:  # (a URL redis-py takes: the host it connects to is shown)
        assert urlsplit(shown).hostname == urlsplit(url).hostname, shown


def test_urls_every_entry_point_takes() -> None:
    for url in ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/3",
                "rediss://u:p%2Fq@h:1/0?ssl_cert_reqs=none", "unix:///tmp/r.sock?db=1",
                "redis://[::1]:6379/0?socket_timeout=5&client_name=x",
                "redis://127.0.0.1:6379/0?max_connections=20"):
        assert url_problem(url) is None, url
        assert check_url(url) == url
        assert ConsumerGroupConfig(group_id="g", topics=["t"], redis_url=url).redis_url == url
        assert ServiceConfig(redis_url=url).redis_url == url
        assert parse_read_options({"url": url, "subscribe": "t"}, "batch", env={}).url == url


def test_the_pool_size_docs_gateway_md_tells_operators_to_set_is_taken(redis_server: Any) -> None:
    """docs/gateway.md: "set another with ``?max_connections=N`` in ``--redis-url``". Every
    URL check refused it as a misspelt connection option, so no process could be given it."""
    from rcoord.connect import connect
    from rcoord.gateway.server import async_single_node

    url = check_url(f"{redis_server.url}?max_connections=7")
    client = connect(url)
    try:
        assert client.connection_pool.max_connections == 7
    finally:
        client.close()
    assert async_single_node(url).connection_pool.max_connections == 7


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0?ssl_ca_certs=/etc/ca.pem",
                                 "unix:///tmp/r.sock?ssl_cert_reqs=required"])
def test_a_tls_option_on_a_plain_url_says_it_needs_rediss(url: str) -> None:
    """It was refused as a misspelling, "'ssl_ca_certs' is not a connection option (check the
    spelling; e.g. ..., ssl_ca_certs)", naming the very option given as a right spelling."""
    for message in _entry_point_errors(url):
        assert "is a TLS option, for a rediss:// URL only" in message, message
        assert "check the spelling" not in message, message
    assert url_problem("rediss://127.0.0.1:6379/0?ssl_ca_certs=/etc/ca.pem") is None


@pytest.mark.parametrize(("url", "says"), [
    ("redis://:6379/0", "the host is missing (redis-py would connect to localhost)"),
    ("redis://admin:Zm9vYmFy@:6379/0", "the host is missing"),
    ("unix://", "the socket path is missing"),
])
def test_a_url_without_a_host_is_refused(url: str, says: str) -> None:
    """redis://${REDIS_HOST}:6379 with the variable unset: every entry point took it, and
    redis-py connected to localhost, whatever Redis (or none) ran there."""
    for message in _entry_point_errors(url):
        assert says in message and "Zm9vYmFy" not in message, message


@pytest.mark.parametrize(("url", "read"), [
    ("redis://h:1/0?password=ab@Zm9vYmFy", {"host": "h", "password": "ab@Zm9vYmFy"}),
    ("redis://h:1/0?client_name=a@b", {"host": "h", "client_name": "a@b"}),
    ("redis://u:p@h:1/2?client_name=a@b&socket_timeout=5", {"host": "h", "client_name": "a@b"}),
    ("rediss://h:1/0?ssl_password=a@b@c&ssl_cert_reqs=none", {"host": "h", "ssl_password": "a@b@c"}),
    ("redis://[::1]:6379/0?client_name=a@b", {"host": "::1", "client_name": "a@b"}),
    ("unix:///tmp/r.sock?client_name=a@b", {"path": "/tmp/r.sock", "client_name": "a@b"}),
])
def test_an_at_in_a_query_value_is_taken_as_redis_py_reads_it(url: str, read: Any) -> None:
    """Every entry point refused these ("a '/', '?', '#' or '@' in the user name or password
    must be percent-encoded"): an '@' outside urllib's authority was taken for the end of a
    password holding a raw '/', '?' or '#'. redis-py reads the '@' as the value's (the
    authority ends at the first '/', '?' or '#'), so the URL is taken as it reads it."""
    from redis.connection import parse_url

    options = parse_url(url)
    assert {k: options[k] for k in read} == read, options
    assert url_problem(url) is None, url_problem(url)
    assert check_url(url) == url
    assert ConsumerGroupConfig(group_id="g", topics=["t"], redis_url=url).redis_url == url
    assert ServiceConfig(redis_url=url).redis_url == url
    assert parse_read_options({"url": url, "subscribe": "t"}, "batch", env={}).url == url


@pytest.mark.parametrize("url", [
    "redis://u:12?c=Zm9vYmFy@h:1/0",  # (not an option of redis-py's: a password's '?')
    "redis://u:ab?client_name=Zm9vYmFy@h:1/0",  # ('u:ab' is no host and port)
    "redis://u:12/Zm9v@h:1/0?client_name=a@b",  # (an '@' in the path)
    "redis://h:1/0?client_name=a#Zm9vYmFy@h",  # (an '@' in the fragment)
    "redis://:12?client_name=Zm9vYmFy@h:1/0",  # (no host before the '?')
    "unix://u:12?client_name=Zm9vYmFy@/tmp/r.sock",  # (a unix URL's authority has no host)
])
def test_an_at_that_may_end_a_password_is_still_refused(url: str) -> None:
    """The '@' of a query value is taken only where what comes before the '?' is a host (and
    port, database) and the argument is one redis-py takes: otherwise the '@' may end a password
    holding a raw '?', '/' or '#', and the message asks for it to be percent-encoded."""
    assert url_problem(url) is not None and "percent-encoded" in url_problem(url), url
    for message in _entry_point_errors(url):
        assert "percent-encoded" in message and "Zm9v" not in message, message


def test_a_bad_query_value_beside_an_at_is_named_as_redis_py_names_it() -> None:
    problem = url_problem("redis://h:1/0?client_name=a@b&socket_timeout=x")
    assert problem is not None and "Invalid value for 'socket_timeout'" in problem, problem


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://h:1/0?client_name=a@b", "redis://h:1/0?client_name=a@b"),
    ("redis://u:Zm9vYmFy@h:1/0?client_name=a@b&db=1", "redis://u:***@h:1/0?client_name=a@b&db=1"),
    ("rediss://[::1]:1?client_name=a@b@c", "rediss://[::1]:1?client_name=a@b@c"),
    ("unix:///tmp/r.sock?client_name=a@b", "unix:///tmp/r.sock?client_name=a@b"),
    # (an '@' that may end a password holding a raw '?': masked, as before)
    ("redis://u:Zm9v?c=d@h", "redis://u:***@h"),
    ("redis://u:12?c=Zm9vYmFy@h:1/0", "redis://u:***@h:1/0"),
    ("redis://u:Zm9v?client_name=d@h", "redis://u:***@h"),
    ("redis://h:1/0?client_name=a#Zm9vYmFy@h", "redis://h:***@h"),
])
def test_an_at_in_a_query_value_redis_py_reads_ends_no_user_info(url: str, shown: str) -> None:
    """'redis://h:1/0?client_name=a@b' was shown as 'redis://h:***@b': the value's '@' was
    taken for the end of a user info (only a ``?password=`` value's was not, 10a7296), so a
    message named a host the URL does not connect to. The user info ends where url_problem
    reads it to; an '@' that may end a password is still taken for its end, the password
    masked."""
    assert redact_url(url, query=True) == shown
    assert redact_url(url) == re.split(r"[?#]", shown)[0]
    assert "Zm9v" not in redact_url(url, query=True)
    if url_problem(url) is None:  # (the host redis-py connects to is the one shown)
        assert urlsplit(shown).hostname == urlsplit(url).hostname, shown
