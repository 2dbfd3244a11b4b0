"""The contract between the Python side and the Lua library, written once, here.

Both languages must agree on the group states and their valid previous states
(``rcoord.state``), the settings and their defaults (``rcoord.config``), the order of a group
step's keys (``rcoord.keys``) and the named error replies (``rcoord.errors``). Rather than
keeping a hand-written Lua copy of each and a test that compares the two, ``lua_header()``
renders them as Lua definitions that ``rcoord.scripts`` puts in front of the library. The
library's name hashes its whole source, header included, so a changed contract is a new library
that servers load afresh.

The group hash's core and brief fields (the ones a step reads in its first HMGET) are listed
here too, with what each holds, because the library's readers are generated from the lists. The
other member-record and group-hash field names (``jk``, ``as``, ``pr`` ...) are private to the
Lua side: Python reads them only in tests, so they are not part of this contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from .config import STORED_SETTINGS, CoordinatorConfig
from .errors import script_error_names
from .state import VALID_PREVIOUS, GroupState

__all__ = ["GROUP_BRIEF_FIELDS", "GROUP_CORE_FIELDS", "GROUP_KEYS", "HEARTBEAT_KEYS",
           "STATE_CONSTANTS", "lua_header", "setting_defaults"]

GROUP_KEYS: tuple[tuple[str, str], ...] = (
    ("cfg", "K_CFG"),
    ("groups", "K_GROUPS"),
    ("due", "K_DUE"),
    ("group", "K_GROUP"),
    ("members", "K_MEMBERS"),
    ("statics", "K_STATIC"),
    ("pending", "K_PENDING"),
    ("joining", "K_JOINING"),
    ("syncing", "K_PSYNC"),
    ("replies", "K_REPLIES"),
    ("wake", "K_WAKE"),
    ("deadlines", "K_DL"),
    ("offsets", "K_OFFSETS"),
    ("hint", "K_HINT"),
    ("events", "K_EVENTS"),
    ("order", "K_ORDER"),
)
"""Every group step's KEYS, in order: (name in ``rcoord.keys``, the Lua local it is bound to).
``GroupKeys.all()`` follows this order; the library binds its locals from it, so neither side
numbers the keys by hand."""

HEARTBEAT_KEYS: tuple[str, ...] = (
    "cfg", "due", "group", "members", "statics", "deadlines", "hint")
"""The heartbeat function's KEYS (it runs outside the group step wrapper and takes only these;
the settings copy only to refuse a stale layout, as every group step does)."""

GROUP_CORE_FIELDS: tuple[tuple[str, str], ...] = (
    ("state", "the group state's name (rcoord.state.GroupState value)"),
    ("prev", "the state before it"),
    ("gen", "generation id"),
    ("ptype", "protocol type ('' for a group used only for offsets)"),
    ("pname", "the selected protocol (assignor) of this generation"),
    ("leader", "the leader's member id"),
    ("wid", "id of the last wake-up entry on the group's wake stream"),
    ("capchk", "group_max_size the membership was last checked against"),
    ("sg", "generation whose SyncGroup assignment is stored"),
    ("oq", "whether the group keeps its members' join order in the order key (leader election)"),
    ("cjk", "join completion still being written in chunks: its cursor"),
    ("csk", "sync propagation still being written in chunks: its cursor"),
    ("ea", ("the group's earliest deadline as published to the partition's due index, never "
            "later than the real one ('-': no deadline; lua/deadline_index.lua)")),
)
"""The group hash fields a membership step reads, in one HMGET, at its start (in this order);
any other field is read when first used. The library's ``GROUP_READS.full`` (the names, their
set, and the builder of the per-call group table in one allocation) is rendered from this
list."""

GROUP_BRIEF_FIELDS: tuple[str, ...] = ("state", "gen", "ptype", "ea", "capchk")
"""The group hash fields the steps that change no membership (OffsetCommit and the other offset
steps, the timer sweep's ``expire_deadlines``, ``await_reply``) read at their start instead of
``GROUP_CORE_FIELDS``: what their common path and the check for passed deadlines use. Every
field an HMGET names costs the server a few tenths of a microsecond whether or not the step uses
it (the eight such fields were about a fifth of ``expire_deadlines``' cost with nothing due,
bench/HISTORY.md); any other field is still read when first used, so a rarer path (a deadline
that falls due and rebalances the group) is only slower, never different."""

REPLY_FIELD_SEPARATOR = ":"
"""A parked call's reply is stored in the group's replies hash under ``<kind>:<member id>``
(kind ``j`` for JoinGroup, ``s`` for SyncGroup): the library's ``reply_field`` is rendered from
this, and a parked caller reads its reply there directly (``reply_field`` below)."""


def reply_field(kind: str, member_id: str) -> str:
    """The replies-hash field holding ``member_id``'s reply to a parked call of ``kind``."""
    return f"{kind}{REPLY_FIELD_SEPARATOR}{member_id}"


STATE_CONSTANTS: dict[GroupState, str] = {
    GroupState.EMPTY: "EMPTY",
    GroupState.PREPARING_REBALANCE: "PREPARING",
    GroupState.COMPLETING_REBALANCE: "COMPLETING",
    GroupState.STABLE: "STABLE",
    GroupState.DEAD: "DEAD",
}
"""The Lua constant holding each state's name."""

UNDEFAULTED = ("num_partitions",)
"""Stored settings the library has no default for: a partition copy without them is no copy."""


def setting_defaults() -> dict[str, int]:
    """The library's default for each stored setting a partition copy may lack: the
    ``CoordinatorConfig`` defaults."""
    fields = {f.name: f.default for f in dataclasses.fields(CoordinatorConfig)}
    out: dict[str, int] = {}
    for name in STORED_SETTINGS:
        if name in UNDEFAULTED:
            continue
        default = fields[name]
        if not isinstance(default, int):
            raise TypeError(f"CoordinatorConfig.{name} has no int default to render")
        out[name] = default
    return out


def _wrapped(head: str, items: list[str], tail: str = "") -> list[str]:
    """``head`` + comma-separated ``items`` + ``tail``, as lines of at most 100 characters."""
    lines, line = [], head
    for i, item in enumerate(items):
        piece = item + (", " if i < len(items) - 1 else tail)
        if len(line) + len(piece.rstrip()) > 100:
            lines.append(line.rstrip())
            line = "  "
        line += piece
    lines.append(line)
    return lines


def _lua_str(value: str) -> str:
    if not value.replace("_", "").isalnum():
        raise ValueError(f"not a plain name, refusing to render it into Lua: {value!r}")
    return f"'{value}'"


def lua_header(
    valid_previous: Mapping[GroupState, frozenset[GroupState]] = VALID_PREVIOUS,
    defaults: Mapping[str, int] | None = None,
) -> str:
    """The Lua definitions of the contract, the first lines of the library.

    The arguments exist for tests, which render a library with a different table or defaults
    to show that the library follows whatever Python says. Everything is written out in full:
    a library's load runs definitions only (Valkey offers no ``pairs`` then).
    """
    defaults = setting_defaults() if defaults is None else dict(defaults)
    lines = [
        "-- The Python/Lua contract, rendered by rcoord/contract.py from rcoord/state.py,",
        "-- rcoord/config.py, rcoord/contract.py GROUP_KEYS and rcoord/errors.py. Not hand-written:",
        "-- change the Python and the library follows (its name hashes this text too).",
        "",
        "-- Group states and, for each target state, the states a group may be in before it.",
    ]
    states = list(STATE_CONSTANTS)
    lines.append(f"local {', '.join(STATE_CONSTANTS[s] for s in states)} =")
    lines.append("  " + ", ".join(_lua_str(s.value) for s in states))
    lines.append("local VALID_PREVIOUS = {")
    for target in states:
        prevs = sorted(valid_previous.get(target, frozenset()), key=states.index)
        body = ", ".join(f"[{STATE_CONSTANTS[p]}] = true" for p in prevs)
        lines.append(f"  [{STATE_CONSTANTS[target]}] = {{{body}}},")
    lines.append("}")
    lines.append("")
    lines.append("-- Settings a partition copy may lack, and their defaults (CoordinatorConfig).")
    lines.append("local DEFAULTS = {")
    for name, value in defaults.items():
        _lua_str(name)
        lines.append(f"  {name} = {int(value)},")
    lines.append("}")
    lines += _wrapped("local SETTINGS_FIELDS = {", [_lua_str(n) for n in defaults], "}")
    lines.append("")
    lines.append("-- A group step's keys, bound by name (rcoord/keys.py GroupKeys.all() order).")
    lines += _wrapped("local ", [lua for _, lua in GROUP_KEYS])
    lines.append("local function bind_group_keys(keys)")
    for i, (name, lua) in enumerate(GROUP_KEYS, start=1):
        lines.append(f"  {lua} = keys[{i}] -- {name}")
    lines.append("end")
    lines.append("")
    lines.append("-- The group hash fields a step reads at its start: GROUP_CORE_FIELDS for a")
    lines.append("-- membership step, GROUP_BRIEF_FIELDS for the others. Each read: the names, the")
    lines.append("-- same as a set, and the group table built from their HMGET values (false =")
    lines.append("-- absent) in one allocation.")
    lines.append("local GROUP_READS = {")
    core = [name for name, _ in GROUP_CORE_FIELDS]
    for label, names in (("full", core), ("brief", list(GROUP_BRIEF_FIELDS))):
        quoted = [_lua_str(n) for n in names]
        lines.append(f"  {label} = {{")
        lines += _wrapped("    names = {", quoted, "},")
        lines += _wrapped("    set = {", [f"{n} = true" for n in names], "},")
        lines.append("    of = function(v)")
        lines += _wrapped("      return {", [f"{n} = v[{i}] or nil"
                                             for i, n in enumerate(names, 1)], "}")
        lines.append("    end,")
        lines.append("  },")
    lines.append("}")
    lines.append("")
    lines.append("-- A parked call's reply field in the replies hash (REPLY_FIELD_SEPARATOR).")
    lines.append("local function reply_field(kind, id) return kind .. "
                 f"'{REPLY_FIELD_SEPARATOR}' .. id end")
    lines.append("")
    lines.append("-- Named error replies (rcoord/errors.py maps each to its exception).")
    for name in script_error_names():
        lines.append(f"local {name} = {_lua_str(name)}")
    return "\n".join(lines) + "\n"
