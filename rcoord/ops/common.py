"""What every ``rcoord groups`` / ``rcoord topics`` command shares: its options, its connection,
and how it fails (one line on stderr; exit 2 for bad input, 1 for a failure while running, as
the rest of ``rcoord.cli``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..cli import (
    DECIMAL,
    ENV_REDIS_URL,
    EXIT_FAILURE,
    EXIT_USAGE,
    INTEGER,
    LOG_LEVELS,
    AfterCommand,
    Parser,
    StopSignals,
    Terminated,
    UsageError,
    add_tls_arguments,
    check_url,
    env_default,
    log_level,
    report,
    with_tls_files,
)
from ..errors import ConfigError, Errors, InvalidRequestError, ProtocolError
from .output import stdout_gone

__all__ = ["INTEGER", "Context", "Failure", "Progress", "StopSignals", "Terminated", "add_common",
           "integer", "leaf", "nonnegative_seconds", "run", "seconds", "stdout_gone"]



def integer(text: str) -> int:
    """An option's number (argparse ``type``): refused, it is a usage error naming the option."""
    if not INTEGER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (digits, maybe a sign)")
    return int(text)


def seconds(text: str) -> float:
    """An option's seconds (argparse ``type``), ``integer``'s words with a fraction: float()
    alone took "1_0" as 10 and " 3" as 3 where ``integer`` refuses them. The range is the
    option's to check."""
    if not DECIMAL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds (digits, maybe a sign, a fraction and an "
            "exponent: 30, 0.5, 1e3)")
    return float(text)


def nonnegative_seconds(zero: str = "") -> Callable[[str], float]:
    """An argparse ``type``: ``seconds``, finite and at least 0 (the workers' ``--idle-exit-s``
    and ``--run-for``); ``zero`` says what 0 means, for the message. "1e400" is inf, which
    never stopped anything, and a negative number stopped at once, as 0 does when asked."""
    meaning = f" (0: {zero})" if zero else ""

    def parse(text: str) -> float:
        value = seconds(text)
        if not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds >= 0{meaning}")
        return value

    parse.__name__ = "seconds"
    return parse


SOCKET_TIMEOUT_S = 15.0
"""Longer than any blocking read a command makes (``topics consume`` waits 500 ms at most)."""

BAD_INPUT = frozenset({Errors.INVALID_TOPIC_EXCEPTION, Errors.INVALID_PARTITIONS,
                       Errors.INVALID_CONFIG})
"""Kafka errors that mean the arguments were wrong (exit 2, as a bad flag)."""


class Failure(Exception):
    """A command could not do what it was asked; the message says why and what to do (exit 1)."""


def add_common(p: argparse.ArgumentParser) -> None:
    """``--redis-url``, ``--namespace``, ``--output``, ``--log-level`` and the TLS files."""
    p.add_argument("--redis-url", action=AfterCommand, default=env_default(ENV_REDIS_URL),
                   help=f"Redis or Redis Cluster (default ${ENV_REDIS_URL})")
    p.add_argument("--namespace", action=AfterCommand,
                   default=env_default("RCOORD_NAMESPACE", "rcoord"),
                   help="the rcoord namespace (default $RCOORD_NAMESPACE, else rcoord)")
    p.add_argument("--output", action=AfterCommand, choices=("table", "json"), default="table",
                   help="table for people (default), json for programs")
    p.add_argument("--log-level", action=AfterCommand,
                   default=env_default("RCOORD_LOG_LEVEL", "WARNING"),
                   help=f"{', '.join(LOG_LEVELS)}; DEBUG also prints the traceback of an "
                   "error (default $RCOORD_LOG_LEVEL, else WARNING)")
    add_tls_arguments(p)


def leaf(sub: Any, name: str, help_text: str, body: Callable[[Context], int]) -> Parser:
    """A subcommand parser with the common options, whose run is ``body``."""
    p: Parser = sub.add_parser(name, help=help_text, description=help_text)
    add_common(p)
    p.set_defaults(body=body, prog=p.prog)
    return p


@dataclass
class Context:
    """One command's run: its arguments, its Redis client and the admin objects on it."""

    args: argparse.Namespace
    prog: str
    url: str
    client: Any = None
    _coordinator: Any = field(default=None, repr=False)

    @property
    def namespace(self) -> str:
        return str(self.args.namespace)

    @property
    def json(self) -> bool:
        return bool(self.args.output == "json")

    def coordinator(self, *, writes: bool = False) -> Any:
        """A ``GroupCoordinator`` on the namespace that names no setting, so it adopts the stored
        ones and changes none (``rcoord.settings``).

        Unless the command ``writes`` (a reset may commit a new group's first offsets), a
        namespace without settings is an error: starting a coordinator there would establish
        them (dozens of keys), so a mistyped ``--namespace`` would be written to and answered
        as an empty namespace."""
        if self._coordinator is None:
            if not writes and not self.has_settings():
                raise Failure(self.no_settings())
            from ..config import CoordinatorConfig
            from ..coordinator import GroupCoordinator

            config = CoordinatorConfig(namespace=self.namespace)
            self._coordinator = GroupCoordinator(self.client, config).start()
        return self._coordinator

    def group_coordinator(self) -> Any | None:
        """The coordinator for a command that only reads or removes groups, or None where no
        group can exist: a namespace holding topics and no settings (what ``topics create``
        leaves) is no mistake, only one no group has used yet, so such a command answers as
        for any group that does not exist (``groups list`` lists none), as Kafka's tool does
        on a cluster without groups. A namespace holding nothing is still refused
        (``coordinator``), in case ``--namespace`` is mistyped."""
        if self._coordinator is None and not self.has_settings() and self.has_topics():
            return None
        return self.coordinator()

    def has_settings(self) -> bool:
        """Whether the namespace's settings exist, or a copy of them a coordinator would
        restore them from (``rcoord.settings``). Without them the namespace holds no group and
        no committed offset: a group's keys are placed by the stored partition count."""
        from ..keys import anchor_keys, settings_key

        return any(self.client.exists(key)
                   for key in (settings_key(self.namespace), *anchor_keys(self.namespace)))

    def has_topics(self) -> bool:
        """Whether the namespace holds a topic (``rcoord topics create`` stores no settings, so
        a namespace can hold topics and no settings)."""
        return bool(self.topics().list())

    def no_settings(self) -> str:
        """Why a command that needs the namespace's settings found none, told apart by whether
        anything used the namespace: one holding topics is no typo, only one no consumer group
        has used yet."""
        if self.has_topics():
            return (f"namespace {self.namespace!r} has topics but no coordinator settings yet: "
                    "no coordinator or consumer group has used it, so it holds no groups; "
                    "nothing was changed")
        return (f"namespace {self.namespace!r} has no rcoord settings and no topics: no "
                "coordinator, consumer or command has used it (is --namespace, or "
                "$RCOORD_NAMESPACE, right?); nothing was changed")

    def topics(self) -> Any:
        from ..topics import Topics

        return Topics(self.client, self.namespace)

    def refuse_marked_for_deletion(self, topics: Iterable[str], outcome: str) -> None:
        """Refuse a command on a topic a ``delete`` began and did not finish (Kafka refuses
        requests on a topic marked for deletion, and once deleted it has none to act on): its
        surviving partitions would take records, offsets or configs that the delete finishing
        it throws away, or that a topic created again under its name would seem to have.
        ``outcome`` says what was not done. Names no topic can have (committed offsets of
        any source's) are not looked up."""
        from ..topics._base import legal_topic

        marked = self.topics().marked_for_deletion(t for t in topics if legal_topic(t))
        if marked:
            name = marked[0]
            raise Failure(f"topic {name!r} is marked for deletion: a delete of it stopped "
                          f"partway; `rcoord topics delete {name}` finishes it (then `rcoord "
                          f"topics create {name}` makes it again); {outcome}")

    def note(self, text: str) -> None:
        """A remark beside the output (stderr), e.g. a clamped offset."""
        print(f"{self.prog}: {text}", file=sys.stderr, flush=True)


class Progress:
    """Progress on stderr for what takes time: silent for the first second, then at most one
    line a second, so quick commands print nothing but their result."""

    def __init__(self, ctx: Context, every_s: float = 1.0) -> None:
        self._ctx = ctx
        self._every = every_s
        self._next = time.monotonic() + every_s

    def __call__(self, text: Callable[[], str]) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self._every
            self._ctx.note(text())


def run(args: argparse.Namespace) -> int:
    """Check the options, connect, run the chosen subcommand; every error is one line."""
    prog = str(args.prog)
    try:
        level = log_level(args.log_level)
        url = with_tls_files(check_url(args.redis_url), args.tls_ca_file, args.tls_cert_file,
                             args.tls_key_file)
        from ..config import CoordinatorConfig

        CoordinatorConfig(namespace=args.namespace)  # a bad namespace is a usage error
    except (UsageError, ConfigError) as exc:
        return report(exc, prog)
    ctx = Context(args, prog, url)
    try:
        from ..connect import connect

        ctx.client = connect(url, socket_timeout=SOCKET_TIMEOUT_S)
        return int(args.body(ctx))
    except Terminated:
        return 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The command did its work (a reset committed, a list read) and only its output could
        # not be written all: as Kafka's tools, no error for that. Before, a reset piped into
        # a reader that had gone said "unexpected BrokenPipeError" and exited 1 after it had
        # committed, so a script took it for failed.
        stdout_gone()
        return 0
    except (Failure, ProtocolError, InvalidRequestError) as exc:
        if level == "DEBUG":
            import traceback

            traceback.print_exception(exc, file=sys.stderr)
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        bad_input = isinstance(exc, InvalidRequestError) or (
            isinstance(exc, ProtocolError) and exc.error in BAD_INPUT)
        return EXIT_USAGE if bad_input else EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - the edge: one line, the traceback only on DEBUG
        return report(exc, prog, url=url, debug=level == "DEBUG")
    finally:
        if ctx.client is not None:
            ctx.client.close()
