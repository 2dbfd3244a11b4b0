"""The state table: one test per edge (as Kafka's ClassicGroupTest); and the contract the library
takes from Python (rcoord/contract.py): the library follows the Python table, defaults, key
layout and error names, checked by running a library rendered from changed definitions."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import rcoord.scripts
from rcoord import TopicPartition
from rcoord.contract import GROUP_KEYS, HEARTBEAT_KEYS, lua_header, setting_defaults
from rcoord.errors import Errors, IllegalStateError, script_error_names
from rcoord.keys import GroupKeys
from rcoord.scripts import build_library, library_source
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


# -- the contract, as the library uses it ------------------------------------------------------

PROTOCOLS = [("range", b"meta")]


@pytest.fixture
def use_library(redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Make coordinators built afterwards run a library rendered from ``lua_header(**kw)`` (and
    ``tail`` after it) instead of the standard one; the library is deleted from every master afterwards."""
    names: list[str] = []

    def use(tail: str = "", **kw: Any) -> str:
        name, source = build_library(lua_header(**kw) + tail)
        monkeypatch.setattr(rcoord.scripts, "library_source", lambda: (name, source))
        names.append(name)
        return name

    yield use
    nodes = redis_client.get_primaries() if hasattr(redis_client, "get_primaries") else [None]
    for name in names:
        for node in nodes:
            extra = {"target_nodes": node} if node is not None else {}
            try:
                redis_client.execute_command("FUNCTION", "DELETE", name, **extra)
            except redis.ResponseError as exc:  # not loaded on that master: nothing to delete
                assert "not found" in str(exc).lower(), exc


def _join(coord: Any, group_id: str, session_timeout_ms: int = 10_000) -> Any:
    return coord.join_group(group_id, "", protocol_type="consumer", protocols=PROTOCOLS,
                            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=10_000)


def test_library_refuses_a_transition_the_python_table_forbids(make_coordinator, use_library,
                                                               monkeypatch):
    table = {**VALID_PREVIOUS, S.DEAD: VALID_PREVIOUS[S.DEAD] - {S.EMPTY}}
    use_library(valid_previous=table)
    coord = make_coordinator()
    tp = TopicPartition("orders", 0)
    assert coord.commit_offsets("g", {tp: 5})[tp] == Errors.NONE  # an Empty group
    # Deleting an Empty group moves it to Dead, which this table forbids.
    with pytest.raises(IllegalStateError, match=re.escape(
            "should be in one of the states {CompletingRebalance, Dead, PreparingRebalance, "
            "Stable} before moving to Dead state. Instead it is in Empty state.")):
        coord.delete_groups(["g"])
    # Refused before any write: the standard library (Python's own table) deletes it.
    monkeypatch.undo()
    standard = make_coordinator()
    assert standard.fetch_offsets("g", [tp]).offsets[tp].offset == 5
    assert standard.delete_groups(["g"]) == {"g": Errors.NONE}


def test_the_library_has_room_for_more_shared_helpers(make_coordinator, use_library):
    """Lua 5.1 allows the library's main chunk 200 local variables, and every shared helper is
    one. Each step file's own locals end with its block (rcoord/scripts.py ``_scoped``), so they
    do not add up: before, the library stood at the limit and one more helper stopped it from
    loading at all."""
    use_library(tail="local " + ", ".join(f"spare_{i}" for i in range(10)) + "\n")
    coord = make_coordinator()
    assert _join(coord, "g").error == Errors.MEMBER_ID_REQUIRED


def test_a_settings_default_changed_in_python_reaches_the_library(
        make_coordinator, use_library, redis_client, namespace):
    """A partition copy that lacks a setting (one stored before the setting existed) takes the
    library's default, which is Python's."""
    defaults = {**setting_defaults(), "group_min_session_timeout_ms": 20_000}
    use_library(defaults=defaults)
    coord = make_coordinator()
    for group in ("g1", "g2"):
        keys = GroupKeys.of(namespace, coord.config.num_partitions, group)
        redis_client.hdel(keys.named("cfg"), "group_min_session_timeout_ms")
        assert not redis_client.hexists(keys.named("cfg"), "group_min_session_timeout_ms")
    assert _join(coord, "g1", session_timeout_ms=10_000).error == Errors.INVALID_SESSION_TIMEOUT
    assert _join(coord, "g2", session_timeout_ms=20_000).error == Errors.MEMBER_ID_REQUIRED


def test_the_standard_defaults_are_the_config_defaults():
    from rcoord.config import STORED_SETTINGS, CoordinatorConfig

    cfg = CoordinatorConfig()
    assert setting_defaults() == {n: getattr(cfg, n) for n in STORED_SETTINGS
                                  if n != "num_partitions"}


def test_a_changed_contract_is_a_new_library():
    table = {**VALID_PREVIOUS, S.STABLE: frozenset({S.COMPLETING_REBALANCE, S.EMPTY})}
    assert build_library(lua_header(valid_previous=table))[0] != library_source()[0]
    assert build_library(lua_header())[0] == library_source()[0]


def test_every_error_name_the_library_can_return_is_in_the_registry():
    """Kafka error names are returned as string literals (an unknown one would decode as
    UNKNOWN_SERVER_ERROR); rcoord's named error replies only through the header's constants,
    which the registry renders (a misspelt constant is an undefined global, an error at once)."""
    header = lua_header()
    _, source = library_source()
    body = source[source.index(header) + len(header):]
    literals = set(re.findall(r"'([A-Z][A-Z0-9_]*)'|\"([A-Z][A-Z0-9_]*)\"", body))
    names = {a or b for a, b in literals}
    error_like = {n for n in names if "_" in n or n in Errors.__members__}
    assert error_like and error_like <= set(Errors.__members__), error_like - set(Errors.__members__)
    assert not re.search(r"['\"]RCOORD_", body)  # never spelt out, always the constants
    used = set(re.findall(r"\bRCOORD_[A-Z_]+", body))
    assert used and used <= set(script_error_names()), used - set(script_error_names())
    for name in script_error_names():
        assert f"local {name} = '{name}'" in header


def test_group_keys_follow_the_contract_by_name():
    keys = GroupKeys.of("ns", 10, "g")
    assert keys.all() == [keys.named(name) for name, _ in GROUP_KEYS]
    assert len(set(keys.all())) == len(GROUP_KEYS)
    assert keys.heartbeat_keys() == [keys.named(name) for name in HEARTBEAT_KEYS]
    assert set(keys.heartbeat_keys()) <= set(keys.all())
    header = lua_header()
    for i, (name, lua) in enumerate(GROUP_KEYS, start=1):
        assert f"  {lua} = keys[{i}] -- {name}" in header


def test_state_names_are_spelt_only_in_the_header():
    """Every step compares states through the header's constants, so the Python names reach
    all of them (a misspelt constant is an undefined global, an error at once)."""
    header = lua_header()
    _, source = library_source()
    body = source[source.index(header) + len(header):]
    code = "\n".join(line.split("--", 1)[0] for line in body.splitlines())
    for state in S:
        assert f"'{state.value}'" not in code and f'"{state.value}"' not in code, state
        assert f"'{state.value}'" in header
