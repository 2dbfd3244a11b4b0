"""A group-mode query whose batches are planned further apart than its rebalance timeout.

The member commits its batch and rejoins only when Spark plans the next batch, as a Kafka
consumer rejoins only in poll(); a trigger interval plus batch longer than ``rebalanceTimeoutMs``
makes every rebalance drop the query from the group and its batch be read again (a reviewer's
two queries with a 6 s trigger over a 3 s timeout never settled, and re-read the backlog each
batch). Nothing warned about it; the member now says so, naming the option to raise.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from harness import wait_until
from test_spark_core import _member, coord, latest, topics  # noqa: F401  (fixtures)

from rcoord import GroupCoordinator
from rcoord.topics import Producer, Topics

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_plans_further_apart_than_the_rebalance_timeout_are_warned_about(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,  # noqa: F811
        coord: GroupCoordinator, latest: Any, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    """``coord`` sets the namespace's settings (short sessions, no initial delay)."""
    topics.create("ev", 2)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 4)
    caplog.set_level(logging.WARNING, logger="rcoord.spark")
    # Plans back to back: well within the timeout, by a margin a stalled machine keeps (with
    # a 1 s timeout, a stall of a second between the two plans warned).
    quiet = _member(redis_server.url, namespace, single_client, groupId="quiet",
                    rebalanceTimeoutMs="60000")
    try:
        pos = quiet.initial(10)
        pos = quiet.plan(pos, latest, 1)
        quiet.plan(pos, latest, 1)
        assert "rebalanceTimeoutMs" not in caplog.text
    finally:
        quiet.close(5)
    member = _member(redis_server.url, namespace, single_client, rebalanceTimeoutMs="1000")
    try:
        pos = member.initial(10)
        pos = member.plan(pos, latest, 1)
        planned = time.monotonic()
        wait_until(lambda: time.monotonic() - planned > 1.2)  # a trigger interval of 1.2 s
        member.plan(pos, latest, 1)
        warned = [r.getMessage() for r in caplog.records if "rebalanceTimeoutMs" in r.getMessage()]
        assert len(warned) == 1 and "more than rebalanceTimeoutMs (1000 ms)" in warned[0]
        assert "'g'" in warned[0]
    finally:
        member.close(5)
