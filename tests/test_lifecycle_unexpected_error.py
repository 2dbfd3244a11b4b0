"""The group's run thread stopped by an error nothing expected (a bug, a resource the process
ran out of) must say so, and must not leave its generation heartbeating.

Its root only logged the error: ``next()`` raised a bare "group is closed", and the
generation in hand kept its heartbeat (which beats until the routines are collected, which
never happened), so the dead member kept its session and its partitions for good.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import wait_until
from test_client_group import WAIT_S, OneMemberGroup, fake_group  # noqa: F401 - the fixture

from rcoord.client import EndReason, GroupClosedError


def test_an_unexpected_error_is_raised_by_next_and_the_heartbeat_stops(
    fake_group: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    heartbeat = gen._helpers[0]
    assert heartbeat.name.endswith("-heartbeat") and heartbeat.is_alive()
    bug = RuntimeError("a bug in the run loop")

    def collect(ended: Any) -> None:
        raise bug

    monkeypatch.setattr(group, "_collect", collect)
    gen._end(EndReason.REBALANCE)
    with pytest.raises(GroupClosedError, match="unexpected error.*a bug in the run loop") as info:
        group.next(timeout=WAIT_S)
    assert info.value.__cause__ is bug
    assert gen.lost
    wait_until(lambda: not heartbeat.is_alive())  # its session ends; the partitions move
    closing = threading.Thread(target=group.close, daemon=True)  # no timeout: it waited for ever
    closing.start()
    closing.join(WAIT_S)
    assert not closing.is_alive()
