"""The classic group state machine, declared once as a table of valid previous states.

This mirrors Kafka's ``ClassicGroupState``. It is the only copy: ``rcoord.contract`` renders the
table into the Lua library, whose ``transition()`` is the only code that changes a group's state
in Redis. This module is the reference model: ``transition_to`` is what the library's
``transition()`` does, and the predicates below are derived from the table rather than written
as separate ``if`` chains.
"""

from __future__ import annotations

import enum

__all__ = ["VALID_PREVIOUS", "GroupState", "IllegalTransition", "can_rebalance", "transition_to"]


class GroupState(enum.Enum):
    """A classic group's state; the value is Kafka's display name."""

    EMPTY = "Empty"
    """No members; the group lingers until its offsets expire.

    action: join from a new member is handled normally;
            sync, heartbeat, leave and member commits answer UNKNOWN_MEMBER_ID;
            offset fetches are allowed.
    transition: join from a new member => PREPARING_REBALANCE;
                last offsets expired or group deleted => DEAD
    """

    PREPARING_REBALANCE = "PreparingRebalance"
    """Waiting for members to (re)join for the next generation.

    action: heartbeats and syncs answer REBALANCE_IN_PROGRESS;
            joins are parked until every known member has rejoined or the rebalance times out;
            commits from the previous generation are accepted (revocation commits).
    transition: join phase completes with members => COMPLETING_REBALANCE;
                join phase completes with no members => EMPTY;
                group deleted => DEAD
    """

    COMPLETING_REBALANCE = "CompletingRebalance"
    """The generation is formed; waiting for the leader's assignment.

    action: heartbeats are normal; follower syncs are parked until the leader's sync arrives;
            commits answer REBALANCE_IN_PROGRESS.
    transition: leader's sync with assignments => STABLE;
                join from a new member or a changed one, leave, member failure => PREPARING_REBALANCE;
                group deleted => DEAD
    """

    STABLE = "Stable"
    """Every member has its assignment.

    action: heartbeats are normal; syncs return the stored assignment; a follower rejoining
            with unchanged metadata gets the current generation back at once.
    transition: member failure, leave, leader rejoin, changed metadata => PREPARING_REBALANCE;
                group deleted => DEAD
    """

    DEAD = "Dead"
    """The group is being removed; its keys are deleted in the same script.

    action: every request answers COORDINATOR_NOT_AVAILABLE (join, sync, heartbeat, leave).
    transition: none (final).
    """


_S = GroupState

VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE}),
    _S.PREPARING_REBALANCE: frozenset({_S.STABLE, _S.COMPLETING_REBALANCE, _S.EMPTY}),
    _S.COMPLETING_REBALANCE: frozenset({_S.PREPARING_REBALANCE}),
    _S.STABLE: frozenset({_S.COMPLETING_REBALANCE}),
    _S.DEAD: frozenset(
        {_S.STABLE, _S.PREPARING_REBALANCE, _S.COMPLETING_REBALANCE, _S.EMPTY, _S.DEAD}
    ),
}
"""For each target state, the states a group may be in just before entering it (Kafka's table)."""


class IllegalTransition(Exception):
    """Raised by the reference model, worded like Kafka's assertValidTransition."""


def transition_to(current: GroupState, target: GroupState) -> GroupState:
    """Return ``target`` if the table allows ``current -> target``, else raise."""
    allowed = VALID_PREVIOUS[target]
    if current not in allowed:
        names = ", ".join(sorted(s.value for s in allowed))
        raise IllegalTransition(
            f"Group should be in one of the states {{{names}}} before moving to "
            f"{target.value} state. Instead it is in {current.value} state."
        )
    return target


def can_rebalance(state: GroupState) -> bool:
    """A rebalance may start from ``state`` exactly when PREPARING_REBALANCE lists it."""
    return state in VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]
