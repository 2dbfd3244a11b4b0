"""The state table: one test per edge (as Kafka's ClassicGroupTest), and Lua/Python parity."""

from __future__ import annotations

import re

import pytest

from rcoord.config import CoordinatorConfig, STORED_SETTINGS
from rcoord.scripts import lua_dir
from rcoord.state import VALID_PREVIOUS, GroupState, IllegalTransition, can_rebalance, transition_to

S = GroupState
ALLOWED = {(prev, target) for target, prevs in VALID_PREVIOUS.items() for prev in prevs}
ALL_PAIRS = [(a, b) for a in S for b in S]


@pytest.mark.parametrize("prev,target", sorted(ALLOWED, key=str))
def test_declared_transition_is_legal(prev, target):
    assert transition_to(prev, target) is target


@pytest.mark.parametrize("prev,target", sorted(set(ALL_PAIRS) - ALLOWED, key=str))
def test_undeclared_transition_is_illegal(prev, target):
    with pytest.raises(IllegalTransition, match=f"before moving to {target.value} state. Instead it is in {prev.value}"):
        transition_to(prev, target)


def test_table_matches_kafka():
    assert VALID_PREVIOUS[S.EMPTY] == {S.PREPARING_REBALANCE}
    assert VALID_PREVIOUS[S.PREPARING_REBALANCE] == {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}
    assert VALID_PREVIOUS[S.COMPLETING_REBALANCE] == {S.PREPARING_REBALANCE}
    assert VALID_PREVIOUS[S.STABLE] == {S.COMPLETING_REBALANCE}
    assert VALID_PREVIOUS[S.DEAD] == set(S)


def test_can_rebalance_is_derived_from_the_table():
    assert {s for s in S if can_rebalance(s)} == {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}


def _lua_prelude() -> str:
    return (lua_dir() / "prelude.lua").read_text()


def test_lua_state_table_equals_python_table():
    src = _lua_prelude()
    names = dict(re.findall(r"(EMPTY|PREPARING|COMPLETING|STABLE|DEAD)\b", src) and [])
    consts = re.search(r"local EMPTY, PREPARING, COMPLETING, STABLE, DEAD =\s*(.*?)\n", src).group(1)
    values = [v.strip().strip("'") for v in consts.split(",")]
    lua_name = dict(zip(["EMPTY", "PREPARING", "COMPLETING", "STABLE", "DEAD"], values))
    table = re.search(r"local VALID_PREVIOUS = \{(.*?)\n\}", src, re.S).group(1)
    parsed = {}
    for target, prevs in re.findall(r"\[(\w+)\] = \{(.*?)\}", table):
        parsed[GroupState(lua_name[target])] = frozenset(
            GroupState(lua_name[p]) for p in re.findall(r"\[(\w+)\] = true", prevs)
        )
    assert not names
    assert parsed == VALID_PREVIOUS


def test_lua_defaults_equal_config_defaults():
    src = _lua_prelude()
    block = re.search(r"local DEFAULTS = \{(.*?)\n\}", src, re.S).group(1)
    lua = {k: int(v) for k, v in re.findall(r"(\w+) = (\d+)", block)}
    cfg = CoordinatorConfig()
    expected = {k: getattr(cfg, k) for k in STORED_SETTINGS if k != "num_partitions"}
    assert lua == expected
