"""A group-mode Spark query whose group closed on an error no retry mends (a login Redis
refuses, a permission the user lacks) fails with that error, naming what to fix.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from harness import WAIT_S, wait_until
from test_client_group import OneMemberGroup, fast_config

from rcoord import AuthenticationFailedError, Errors
from rcoord.client import ConsumerGroup
from rcoord.errors import as_authentication_failed
from rcoord.spark.member import StreamMember


def _nothing_new(parts: Any) -> tuple[dict[Any, tuple[int, int]], dict[str, str]]:
    return {tp: (0, 0) for tp in parts}, {}


def test_a_group_closed_between_two_plans_fails_the_next_with_its_error() -> None:
    """The rejoin outlasts the plan's wait (the plan builds no batch and returns), and then
    Redis refuses the login (the password was rotated): the group closes on it between two
    triggers. The next plan() raised ``GroupClosedError("group 'g' is closed")`` from the
    group's ``start()``, which does not say why; the query now fails with the login error."""
    state = OneMemberGroup(topic="ev", partitions=2)
    group = ConsumerGroup(fast_config(topics=["ev"]), coordinator=state.fake)  # type: ignore[arg-type]
    member = StreamMember(group, rejoin_wait_s=0.05)
    release = threading.Event()
    refused = as_authentication_failed(
        "join_group", redis.exceptions.AuthenticationError("invalid username-password pair"))

    def join_refused_late(*args: Any, **kwargs: Any) -> Any:
        state.joins.append(kwargs.get("member_id", args[1] if len(args) > 1 else ""))
        assert release.wait(WAIT_S)
        raise refused

    try:
        first = member.initial(10)
        gen = member.generation
        assert gen is not None
        state.fake.join_group = join_refused_late  # type: ignore[attr-defined]
        state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
        wait_until(gen.done.is_set)
        assert member.plan(first, _nothing_new, None) == first  # no generation in time
        wait_until(lambda: len(state.joins) == 2)  # the rejoin is under way
        release.set()
        wait_until(lambda: group.closed)
        with pytest.raises(AuthenticationFailedError, match="refused the login"):
            member.plan(first, _nothing_new, None)
        with pytest.raises(AuthenticationFailedError):  # every later plan too
            member.plan(first, _nothing_new, None)
    finally:
        release.set()
        member.close(5)
