"""Review 75 of the Spark data source's group mode (``StreamMember``): reproductions of defects.

Each test fails on the code it was written against; none needs a JVM.
"""

from __future__ import annotations

import pytest
from test_spark_review63_commit_hold import (  # noqa: F401  (fixtures)
    EV0,
    NOT_MADE,
    Planned,
    _committed,
    _lose_commits,
    coord,
    planned,
    topics,
)

from rcoord import GroupCoordinator


@pytest.mark.parametrize("error", NOT_MADE)
def test_a_commit_held_through_an_outage_and_then_made_is_not_counted_as_refused(
        error: str, planned: Planned, coord: GroupCoordinator,  # noqa: F811 - fixtures
        monkeypatch: pytest.MonkeyPatch) -> None:
    # ``refused`` is documented as the commits the coordinator refused (the group moved on),
    # whose partitions their owner processes again. A commit Redis did not make holds the
    # plan instead and is made by a later plan: nothing was refused, nothing is read again.
    # Each held plan was counted as a refusal (UNKNOWN_SERVER_ERROR), so an outage of n plans
    # showed n refused commits for a batch that was committed once, in full.
    a, end1, latest = planned.member, planned.end1, planned.latest
    planned.producer.send_batch("ev", [b"y"] * 6)
    _lose_commits(a, monkeypatch, 2, NOT_MADE[error])
    assert a.plan(end1, latest, None) == end1  # held
    assert a.plan(end1, latest, None) == end1  # held again
    end2 = a.plan(end1, latest, None)  # the commit lands
    assert end2 != end1
    assert _committed(coord) == {EV0: 4}
    assert [(o.offsets, o.accepted) for o in a.outcomes if o.accepted] == [({EV0: 4}, True)]
    assert a.refused == [], [o.error.name for o in a.refused]
