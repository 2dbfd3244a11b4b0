"""The error a group closed on, raised by every later call (``next()``, ``start()``,
``connect()``, and so the Consumer's poll() and offset queries): each raise is of the same
exception object, and must not add to what the earlier ones left on it."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
from test_client_group import WAIT_S, OneMemberGroup, fake_group

from rcoord import Errors
from rcoord.client import JoinRefusedError

__all__ = ["fake_group"]


def _frames(call: Any) -> int:
    with pytest.raises(JoinRefusedError) as info:
        call()
    return len(traceback.extract_tb(info.value.__traceback__))


def test_the_fatal_error_raised_again_does_not_grow_its_traceback(fake_group: Any) -> None:
    """Python prepends the raising frames to an exception's traceback each time the same
    object is raised. Before, every call after a fatal close (a loop that logs poll()'s error
    and polls again) made the traceback longer: memory that grew with each call, and log
    lines (``log.exception``) that grew with it. Each raise now starts from the traceback
    the error had when the group closed on it."""
    state = OneMemberGroup()
    state.join_answers.append(Errors.GROUP_AUTHORIZATION_FAILED)
    group = fake_group(state)
    first = _frames(lambda: group.next(timeout=WAIT_S))
    assert [_frames(lambda: group.next(timeout=WAIT_S)) for _ in range(3)] == [first] * 3
    started = _frames(group.start)
    assert [_frames(group.start) for _ in range(3)] == [started] * 3
    connected = _frames(group.connect)
    assert [_frames(group.connect) for _ in range(3)] == [connected] * 3
