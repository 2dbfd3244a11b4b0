"""The ``rcoord`` command line.

``rcoord coordinator`` runs one coordinator process (``rcoord.service``).

``rcoord demo`` runs the main job end to end (``rcoord.demo``). ``rcoord groups`` and ``rcoord
topics`` are the operator's commands (``rcoord.ops``).

This module holds what every command shares at its edge: one-line errors, URL and TLS flags,
stop signals.

Subcommands are registered in ``COMMANDS`` (name -> (add arguments, run)).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
import redis.exceptions

from .urls import redact_url as redact
from .urls import url_problem

__all__ = ["COMMANDS", "AfterCommand", "StopSignals", "Terminated", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rcoord`` / ``python -m rcoord``; returns the exit status."""
    parser = Parser(prog="rcoord", description="Kafka's consumer groups on Redis.")
    add_before_command(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_arguments, _, help_text) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    apply_before_command(parser, args)
    return COMMANDS[args.command][1](args)


ENV_REDIS_URL = "RCOORD_REDIS_URL"


# -- errors at the edge -----------------------------------------------------------------------
#
# A command that cannot run says what to fix in one line on stderr and exits non-zero: 2 for a
# bad flag or setting (nothing was tried), 1 for what went wrong while running (Redis refused,
# unreachable, a permission missing). The traceback is for developers: ``--log-level debug``.

EXIT_USAGE = 2
EXIT_FAILURE = 1
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


class UsageError(Exception):
    """A flag's value is wrong; the message says which and what is allowed (exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (``rcoord demo: error: ...``) and exit 2.

    A command's own parser (one with no subcommands) names an option it does not know before
    anything else: argparse sets unknown options aside and first complains about the required
    ones they leave missing, so ``topics create --partitons 3`` said "required: --partitions"
    and hid the typo. It names a word it has no place for too (``groups describe g1 g2``)."""

    _has_commands = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse's own test of "a negative number, not an option" (3.11: ^-\d+$ or
        # ^-\d*\.\d+$, by re.match) takes no exponent: "--time-limit -1e3" passed
        # _unknown_options as a number, then argparse took "-1e3" for an option and said
        # "expected one argument", where "-1000" is named with its range. Both now use one
        # form (``_NUMBER``, anchored at its end since argparse calls match()).
        self._negative_number_matcher = _NUMBER

    def add_subparsers(self, **kwargs: Any) -> Any:
        self._has_commands = True
        return super().add_subparsers(**kwargs)

    dash_values: frozenset[str] = frozenset()
    """Long options of this parser whose value may start with a dash (``--by-duration
    -PT1H``, ``--key-separator '->'``): argparse takes such a value for an option, so it is
    joined to its flag first, unless it names one of this parser's options (a value left out
    before the next flag stays argparse's "expected one argument", not a value)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if args is None:  # (as argparse reads it: a script's ``parse_args()`` is checked too)
            args = sys.argv[1:]
        if self._has_commands:
            return super().parse_known_args(args, namespace)
        args = self._join_dash_values(list(args))
        unknown = self._unknown_options(args)
        if unknown:
            self.error(unknown)
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            # A word left over (``groups describe g1 g2``) went up to the top-level parser,
            # whose error pointed at ``rcoord --help``, which says nothing about the command.
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra

    def _join_dash_values(self, args: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                out.extend(args[i:])
                break
            if (self._takes_dash_value(arg) and i + 1 < len(args)
                    and args[i + 1].startswith("-") and args[i + 1] != "--"
                    and not self._names_option(args[i + 1])):
                out.append(f"{arg}={args[i + 1]}")
                i += 2
                continue
            out.append(arg)
            i += 1
        return out

    def _names_option(self, arg: str) -> bool:
        """Whether ``arg`` is one of this parser's options (``--flag`` or ``--flag=value``)."""
        # _option_string_actions: see _unknown_options.
        return arg.split("=", 1)[0] in self._option_string_actions

    def _takes_dash_value(self, arg: str) -> bool:
        """Whether ``arg`` names one of ``dash_values``, also abbreviated as argparse would
        read it (the unique long option it begins): ``--by-dur -PT1H`` was refused as an
        unknown ``-P``."""
        if arg in self.dash_values:
            return True
        if not (self.allow_abbrev and arg.startswith("--") and "=" not in arg):
            return False
        # _option_string_actions: see _unknown_options.
        named = [f for f in self._option_string_actions if f.startswith(arg)]
        return len(named) == 1 and named[0] in self.dash_values

    def _unknown_options(self, args: Sequence[str]) -> str | None:
        """What to say about the options in ``args`` this parser does not take (None: none).
        An abbreviation argparse would accept (a prefix of a long option) counts as known;
        negative numbers and everything after ``--`` are values."""
        # _option_string_actions is argparse's own table of every flag (mutually exclusive
        # groups' included), unchanged since argparse began.
        flags = list(self._option_string_actions)
        bad: list[str] = []
        for arg in args:
            if arg == "--":
                break
            if not arg.startswith("-") or arg == "-" or _NUMBER.fullmatch(arg):
                continue
            if " " in arg and arg.split("=", 1)[0] not in flags:
                continue  # argparse takes it for a value (``--key-separator '-> '``)
            flag = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
            if not any(f == flag or (self.allow_abbrev and flag.startswith("--")
                                     and f.startswith(flag)) for f in flags):
                bad.append(flag)
        if not bad:
            return None
        import difflib

        hints = [f"{flag} (did you mean {close[0]}?)" if close else flag
                 for flag in bad
                 for close in [difflib.get_close_matches(flag, flags, n=1, cutoff=0.7)]]
        return f"unrecognized option{'s' if len(bad) > 1 else ''}: {', '.join(hints)}"

    def error(self, message: str) -> Any:  # the argparse hook; never returns
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


INTEGER = re.compile(r"[-+]?[0-9]+", re.ASCII)
"""A number as the commands take it, a sign and ASCII digits. int() also takes "1_0" as 10
and " 3", which Java's ``Long.valueOf`` (how Kafka's tools read their options) refuses; both
take other scripts' digits ("\u0663" as 3), which rcoord refuses too: on a command line they
are a paste from elsewhere, not a number the operator meant."""
_UNSIGNED_DECIMAL = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
"""``DECIMAL`` without its sign, ASCII digits only: the one definition of both forms below."""
DECIMAL = re.compile(rf"[-+]?{_UNSIGNED_DECIMAL}", re.ASCII)
"""A number of seconds as the commands take it: ``INTEGER``'s digits, maybe a fraction and an
exponent. float() also takes "1_0", " 3", "nan" and "inf"."""


_NUMBER = re.compile(rf"-{_UNSIGNED_DECIMAL}\Z", re.ASCII)
"""A negative number (``DECIMAL``'s forms, an exponent too): a value, not an unknown option.
(It spelt ``DECIMAL``'s form again with ``\\d``, which takes other scripts' digits: "-\u0663"
was let through as a value where every number rcoord reads is ASCII digits.)"""


# -- options before the command ----------------------------------------------------------------
#
# ``rcoord --redis-url URL topics list`` is ``rcoord topics list --redis-url URL``: the options
# every command shares may come before the command too, and one given after it wins. argparse
# cannot say this by itself: the command's parser fills its defaults into a new namespace that
# is then copied over what the main parser stored, so an option given before the command would
# be overwritten by the command's default. So the main parser keeps what it reads aside (in
# ``_BEFORE``), the command's shared options (``action=AfterCommand``) note that they were given,
# and ``apply_before_command`` puts each value read before the command where none was given
# after it.

_BEFORE = "_before_command"
_AFTER = "_given_after_command"


class _BeforeCommand(argparse.Action):
    """An option of the main parser: kept aside until the command's parser has run."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, _BEFORE, {**getattr(namespace, _BEFORE, {}), self.dest: values})


class AfterCommand(argparse.Action):
    """A command's shared option (argparse's ``store``), noting that it was given, so that it
    wins over the same option given before the command."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, _AFTER, getattr(namespace, _AFTER, frozenset()) | {self.dest})


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, ``docker stop``, systemd) during a command that installed
    ``StopSignals``: it unwinds as Ctrl-C does, so the command's ``finally`` blocks run (a
    console consumer commits what it printed and leaves its group), and exits 143 (the demo too)."""


class StopSignals:
    """SIGTERM (``kill``, ``timeout``, ``docker stop``, systemd) ends this (main) thread's
    command as Ctrl-C does (``Terminated``; Kafka's console consumer closes its consumer from a
    shutdown hook on SIGTERM; without this the process died at once, still a member of its
    group for a session timeout with nothing it printed committed).

    A SIGTERM or SIGINT that arrives inside ``held()`` is raised when the block ends, so a piece
    of work and the record of it are never parted: the console consumer had written a line and
    was stopped before it counted it, so the line was sought back and never committed, although
    printed. ``on_stop`` (a consumer's ``wakeup``) is called when a signal is held, to end a
    wait inside the block early.

    Only the first signal stops; the second is ignored, so it cannot cut short the clean stop
    the first began (a console consumer's final commit and LeaveGroup). GNU ``timeout`` sends
    its SIGTERM twice (to the command and to its process group), as ``kill PID`` then ``kill
    -- -PGID`` does; the second used to raise inside ``close()``, and the member stayed in its
    group for a session timeout with nothing committed. Kafka's console consumer closes from a
    shutdown hook, which further SIGTERMs do not interrupt. A third signal raises at once,
    wherever it lands: an operator insisting can still end a write blocked on a full pipe (that
    line then counts as not printed) or a close that hangs."""

    def __init__(self) -> None:
        self._held = 0
        self._pending: BaseException | None = None
        self._signals = 0  # stop signals received
        self._previous: dict[int, Any] = {}
        self.on_stop: Callable[[], None] | None = None

    def install(self) -> StopSignals:
        import signal

        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # Only where Ctrl-C raises already: an ignored SIGINT (nohup, a background job)
            # stays ignored.
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        return self

    def restore(self) -> None:
        import signal

        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        exc = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        self._signals += 1
        if self._signals == 2:
            return  # the stop under way goes on
        if self._signals == 1 and self._held:
            self._pending = exc
            if self.on_stop is not None:
                self.on_stop()
            return
        raise exc

    @contextmanager
    def held(self) -> Iterator[None]:
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._pending is not None:
                pending, self._pending = self._pending, None
                raise pending


def add_before_command(p: argparse.ArgumentParser) -> None:
    """The shared options, on the main parser. ``--log-level`` is checked here as the gateway
    checks it (upper-cased, one of LOG_LEVELS), so every command gets a level it accepts."""
    also = " (also after the command, where it wins)"
    p.add_argument("--redis-url", action=_BeforeCommand, default=argparse.SUPPRESS, metavar="URL",
                   help=f"Redis or Redis Cluster (default ${ENV_REDIS_URL}){also}")
    p.add_argument("--namespace", action=_BeforeCommand, default=argparse.SUPPRESS, metavar="NS",
                   help=f"the rcoord namespace{also}")
    p.add_argument("--output", action=_BeforeCommand, default=argparse.SUPPRESS,
                   choices=("table", "json"), help=f"groups and topics: table or json{also}")
    p.add_argument("--log-level", action=_BeforeCommand, default=argparse.SUPPRESS,
                   type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                   help=f"{', '.join(LOG_LEVELS)}{also}")
    for flag in ("--tls-ca-file", "--tls-cert-file", "--tls-key-file"):
        p.add_argument(flag, action=_BeforeCommand, default=argparse.SUPPRESS, metavar="FILE",
                       help=f"for rediss:// URLs{also}")


def apply_before_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Give ``args`` the options read before the command, where the command's own were not
    given; a usage error (exit 2) names one the command does not take."""
    before = vars(args).pop(_BEFORE, {})
    after = vars(args).pop(_AFTER, frozenset())
    for dest, value in before.items():
        if not hasattr(args, dest):
            flag = "--" + dest.replace("_", "-")
            parser.error(f"{flag} is not an option of {parser.prog} {args.command}")
        if dest not in after:
            setattr(args, dest, value)


class FromEnv(str):
    """A flag's default read from the environment variable ``variable``: a bad value's error
    names the variable (``env_note``), not only the flag the operator did not type."""

    variable = ""


def from_env(value: str, name: str) -> FromEnv:
    """``value`` marked as read from the environment variable ``name``."""
    out = FromEnv(value)
    out.variable = name
    return out


class FromEnvInt(int):
    """A number a ``FromEnv`` value was read as (argparse's ``type`` turns a default string
    into a plain int, and with it forgot the variable): a range check made after parsing can
    still name the variable (``env_note``)."""

    variable = ""


def env_default(name: str, default: Any = None) -> Any:
    """A flag's default: the variable ``name`` (marked, ``from_env``) when set and not empty,
    else ``default``."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return from_env(value, name)


def env_note(value: object) -> str:
    """' (from $VARIABLE)' for a value read from the environment (``env_default``), else ''."""
    return f" (from ${value.variable})" if isinstance(value, (FromEnv, FromEnvInt)) else ""


def log_level(value: str) -> str:
    """A ``--log-level`` value, upper-cased, or a UsageError naming the allowed ones, and the
    environment variable a default came from (``env_default``: the error named only the flag,
    which nobody typed)."""
    level = str(value).strip().upper()
    if level not in LOG_LEVELS:
        raise UsageError(
            f"--log-level {str(value)!r}{env_note(value)} is not a log level; use one of "
            f"{', '.join(LOG_LEVELS)}"
        )
    return level


def check_url(url: str | None, flag: str = "--redis-url") -> str:
    """The URL if it is one rcoord takes (``rcoord.urls``), else a UsageError that says what to
    fix, the URL shown without its password (and the variable it came from, ``env_note``)."""
    if not url:
        raise UsageError(f"{flag} is required (or set ${ENV_REDIS_URL})")
    problem = url_problem(url)
    if problem:
        sep = " " if problem.startswith("is not") else ": "
        raise UsageError(f"{flag} {redact(url, query=True)!r}{env_note(url)}{sep}{problem}")
    return url


def with_tls_files(url: str, ca_file: str | None, cert_file: str | None,
                   key_file: str | None) -> str:
    """``url`` with redis-py's TLS query arguments added (``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``), so every process the URL is given to verifies the server the same way."""
    from urllib.parse import urlencode

    given = [
        (flag, name, value)
        for flag, name, value in (
            ("--tls-ca-file", "ssl_ca_certs", ca_file),
            ("--tls-cert-file", "ssl_certfile", cert_file),
            ("--tls-key-file", "ssl_keyfile", key_file),
        )
        if value
    ]
    if not given:
        return url
    # Each named as its flag and the variable it came from (env_note): a $RCOORD_TLS_* set for
    # another command was refused as "--tls-ca-file/--tls-cert-file/--tls-key-file", flags
    # nobody typed, and a missing file as "ssl_ca_certs file ...", neither flag nor variable.
    if not url.startswith("rediss://"):
        names = ", ".join(f"{flag}{env_note(value)}" for flag, _, value in given)
        raise UsageError(f"{names}: TLS files need a rediss:// URL")
    for flag, _, value in given:
        if not os.path.isfile(value):
            raise UsageError(f"{flag} file {str(value)!r}{env_note(value)} does not exist")
    return url + ("&" if "?" in url else "?") + urlencode(
        {name: str(value) for _, name, value in given})


def add_tls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca-file", action=AfterCommand,
                   default=env_default("RCOORD_TLS_CA_FILE"),
                   help="CA certificate(s) that sign the server's certificate, for rediss:// "
                   "(default $RCOORD_TLS_CA_FILE; else the system's CAs)")
    p.add_argument("--tls-cert-file", action=AfterCommand,
                   default=env_default("RCOORD_TLS_CERT_FILE"),
                   help="client certificate, if the server asks for one (mutual TLS; "
                   "default $RCOORD_TLS_CERT_FILE)")
    p.add_argument("--tls-key-file", action=AfterCommand,
                   default=env_default("RCOORD_TLS_KEY_FILE"),
                   help="the client certificate's private key (default $RCOORD_TLS_KEY_FILE)")


def _client_certificate_wanted(url: str | None, text: str) -> bool:
    """Whether a connection error is a TLS server's refusal of a client without a certificate.
    Redis's ``tls-auth-clients`` is on by default, so a rediss:// URL without one meets it at
    once: TLS 1.3 ends the handshake before the server checks, so the refusal comes as the
    alert "certificate required" or as the connection closed at the first read, which was
    printed as "cannot reach Redis ...; check the host and port, and that the server runs"."""
    if not url or not url.lower().startswith("rediss://"):
        return False
    if "certificate required" in text.lower():
        return True
    return "closed by server" in text.lower() and "ssl_certfile=" not in url


def explain(exc: BaseException, url: str | None = None) -> tuple[int, str]:
    """(exit status, one line that says what went wrong and what to fix) for ``exc``."""
    from .client.errors import REPLICA_ANSWERS, ReadOnlyReplicaError
    from .errors import (
        AuthenticationFailedError,
        ConfigError,
        ConnectionLost,
        RcoordError,
        ServerUnavailable,
        as_missing_permission,
        is_missing_permission,
    )
    from .testing.embedded import EmbeddedServerError

    at = f" at {redact(url)}" if url else ""
    cause: BaseException = exc
    if (isinstance(exc, (ConnectionLost, AuthenticationFailedError, ReadOnlyReplicaError))
            and exc.__cause__ is not None):
        # The redis-py error says more than our wrapper; a group member that met READONLY at
        # every join is told to give the master's URL as every other command is.
        cause = exc.__cause__
    text = " ".join(str(cause).split()).rstrip(".")
    if isinstance(exc, (UsageError, ConfigError)):
        return EXIT_USAGE, text
    if isinstance(cause, redis.exceptions.AuthenticationError):
        return EXIT_FAILURE, (
            f"Redis{at} refused the login ({text}); check the user and password in the URL "
            "(redis://USER:PASSWORD@HOST:PORT)"
        )
    if isinstance(cause, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            return EXIT_FAILURE, (
                f"the TLS certificate of Redis{at} is not trusted ({text}); give the CA that "
                "signed it with --tls-ca-file (or ?ssl_ca_certs= in the URL)"
            )
        if _client_certificate_wanted(url, text):
            return EXIT_FAILURE, (
                f"Redis{at} ended the TLS connection ({text}): a Redis server asks for a client "
                "certificate unless tls-auth-clients is off; give one with --tls-cert-file and "
                "--tls-key-file (or ?ssl_certfile=&ssl_keyfile= in the URL)"
            )
        return EXIT_FAILURE, (
            f"cannot reach Redis{at}: {text}; check the host and port, and that the server runs"
        )
    if is_missing_permission(exc):
        # rcoord's calls raise MissingPermissionError (rcoord.errors.reraise_as_rcoord); a
        # plain redis-py call's NOPERM gets the same words here.
        return EXIT_FAILURE, " ".join(str(as_missing_permission(exc)).split()).rstrip(".")
    if isinstance(cause, REPLICA_ANSWERS):
        # (MASTERDOWN: a replica with replica-serve-stale-data off, whose link to its master
        # is down, refuses reads too; it was "MasterDownError: Link with MASTER is down ...")
        return EXIT_FAILURE, (
            f"Redis{at} is a read-only replica ({text}); give the URL of its master"
        )
    if isinstance(exc, ServerUnavailable):
        if isinstance(cause, redis.exceptions.OutOfMemoryError) or text.startswith("MISCONF "):
            # rcoord's own words say what to fix first (free memory or raise maxmemory; mend
            # what failed the RDB save): "cannot run this now; try again" dropped them, and
            # the operator tried again into the same refusal.
            own = " ".join(str(exc).split()).rstrip(".").split(": ", 1)[-1]
            return EXIT_FAILURE, (f"Redis{at} {own[len('Redis '):]}" if own.startswith("Redis ")
                                  else f"Redis{at}: {own}")
        return EXIT_FAILURE, f"Redis{at} cannot run this now ({text}); try again"
    if isinstance(cause, redis.exceptions.RedisClusterException):
        return EXIT_FAILURE, f"Redis Cluster{at}: {text}"
    if isinstance(exc, (EmbeddedServerError, RcoordError, redis.exceptions.RedisError)):
        return EXIT_FAILURE, f"{type(cause).__name__}: {text}"
    return EXIT_FAILURE, (
        f"unexpected {type(exc).__name__}: {text} (run with --log-level debug for the traceback)"
    )


def report(exc: BaseException, prog: str, *, url: str | None = None, debug: bool = False) -> int:
    """Print ``exc`` as one line on stderr (with the traceback first if ``debug``); the status."""
    import traceback

    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    code, line = explain(exc, url)
    print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
    return code


def dump_threads_on_sigusr1() -> Callable[[], None]:
    """SIGUSR1 writes every thread's stack to stderr and changes nothing else, as a JVM thread
    dump does for a broker: how an operator (or a test that timed out) sees where a process
    that stopped answering is.

    A Python handler, so it runs on the main thread holding the GIL: no other thread changes
    its frames while they are read. ``faulthandler.register`` wrote from the signal itself,
    reading the stacks of threads that kept running, and now and then crashed the process it
    was asked to describe (SIGSEGV after 2 to 25 dumps of a service expiring members; once in
    a CI run). rcoord's main threads wait in calls a signal interrupts (``Event.wait``, a
    socket read), so the dump comes at once. It writes to stderr's descriptor, through no
    buffer: the main thread may have been stopped inside a write to ``sys.stderr``, holding
    its lock.

    Returns what puts back the handler it replaced, for the command to call when it ends: a
    program running the command in its own process (``rcoord.cli.main``, a test) kept the dump
    for good, SIGUSR1 no longer ended it as it did before, and the dump wrote to a descriptor
    that may since have been closed and reused for a file of that program."""
    import faulthandler
    import signal

    def nothing() -> None:
        pass

    if not hasattr(signal, "SIGUSR1"):  # (not on Windows)
        return nothing
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # stderr is no file (called in-process)
        return nothing

    def dump(signum: int, frame: object) -> None:
        faulthandler.dump_traceback(fd, all_threads=True)

    try:
        before = signal.signal(signal.SIGUSR1, dump)
    except ValueError:  # (not the main thread: called in-process)
        return nothing

    def put_back() -> None:
        try:
            signal.signal(signal.SIGUSR1, before)
        except ValueError:  # (called from another thread than the one that set it)
            pass

    return put_back





# -- rcoord coordinator (rcoord.service) ------------------------------------------------------


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    from .demo import add_arguments

    add_arguments(p)


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(args)


def _coordinator_arguments(p: argparse.ArgumentParser) -> None:
    from .service.cli import add_coordinator_arguments

    add_coordinator_arguments(p)


def _run_coordinator(args: argparse.Namespace) -> int:
    from .service.cli import coordinator_main

    return coordinator_main(args)


# -- rcoord groups / rcoord topics (rcoord.ops) ------------------------------------------------


def _groups_arguments(p: argparse.ArgumentParser) -> None:
    from .ops.groups import add_arguments

    add_arguments(p)


def _topics_arguments(p: argparse.ArgumentParser) -> None:
    from .ops.topics import add_arguments

    add_arguments(p)


def _run_ops(args: argparse.Namespace) -> int:
    from .ops.common import run

    return run(args)


# -- rcoord gateway (rcoord.gateway) -----------------------------------------------------------


def _gateway_arguments(p: argparse.ArgumentParser) -> None:
    from .gateway.cli import add_arguments

    add_arguments(p)


def _run_gateway(args: argparse.Namespace) -> int:
    from .gateway.cli import gateway_main

    return gateway_main(args)


COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]
] = {
    "coordinator": (
        _coordinator_arguments,
        _run_coordinator,
        "run one coordinator process (timers for the partitions it leases; /metrics, /healthz)",
    ),
    "demo": (
        _demo_arguments,
        _run_demo,
        (
            "run a consumer group of worker processes over a topic, kill one, add one, and check "
            "that nothing was lost"
        ),
    ),
    "gateway": (
        _gateway_arguments,
        _run_gateway,
        "serve Kafka's wire protocol: Kafka clients join rcoord groups and use rcoord topics",
    ),
    "groups": (
        _groups_arguments,
        _run_ops,
        "consumer groups: list, describe (with lag), delete, delete-offsets, reset-offsets",
    ),
    "topics": (
        _topics_arguments,
        _run_ops,
        ("topics: create, list, describe, delete, add-partitions, delete-records, "
         "alter-configs, produce, consume"),
    ),
}


if __name__ == "__main__":
    sys.exit(main())
