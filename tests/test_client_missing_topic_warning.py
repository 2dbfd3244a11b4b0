"""Every member warns of its subscribed topics that do not exist, not the leader alone.

Against a real server (one node); every wait is on a condition."""

from __future__ import annotations

import logging
from typing import Any

from harness import wait_until
from test_client_group import WAIT_S, real  # noqa: F401 - the fixture

# Since dfca8db the leader warned of a missing topic at each assignment, but only the leader
# read the counts: a follower started with a --topic typo was assigned nothing and said nothing,
# its warning (if any) in another process's log, the leader's.


def test_a_follower_warns_of_its_topic_that_does_not_exist(
        real: Any, caplog: Any) -> None:  # noqa: F811 - the fixture
    caplog.set_level(logging.WARNING, logger="rcoord.client")
    real.topics.create("t", 2)
    a = real.group(topics=["t", "nosuch"])
    b = real.group(topics=["t", "nosuch"])
    a.start()
    b.start()
    gens: dict[str, Any] = {}

    def both_in_one_generation() -> bool:
        for name, group in (("a", a), ("b", b)):
            newest = group.newest()
            if newest is not None and newest is not gens.get(name):
                gens[name] = group.next(timeout=WAIT_S)
                gens[name].acknowledge()
        return len(gens) == 2 and gens["a"].generation_id == gens["b"].generation_id

    wait_until(both_in_one_generation)
    follower = next(g for g in gens.values() if not g.is_leader)

    assert _warnings(caplog, follower.member_id), [r.getMessage() for r in caplog.records]


def test_the_leader_warns_only_in_its_assignment(
        real: Any, caplog: Any) -> None:  # noqa: F811 - the fixture
    """The leader's assignment read the counts and warned: it does not warn again as a
    member."""
    caplog.set_level(logging.WARNING, logger="rcoord.client")
    real.topics.create("t", 2)
    gen = real.group(topics=["t", "nosuch"]).next(timeout=WAIT_S)
    assert gen.is_leader
    assert _warnings(caplog), [r.getMessage() for r in caplog.records]
    assert not _warnings(caplog, gen.member_id)


def _warnings(caplog: Any, naming: str = "") -> list[str]:
    """The client's warnings of topic 'nosuch' that name ``naming`` too."""
    return [r.getMessage() for r in caplog.records if r.name == "rcoord.client"
            and r.levelno == logging.WARNING and "'nosuch'" in r.getMessage()
            and naming in r.getMessage()]
