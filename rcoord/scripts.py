"""Loading the Lua scripts: each step's file behind the shared prelude, called by SHA.

Scripts are registered once per client in ``Scripts.load()`` (not in a constructor) and called
through redis-py ``Script`` objects, which reload a script on NOSCRIPT, so ``SCRIPT FLUSH``,
a server restart and a failover are survived. Using a script that was never loaded is a bug and
raises at once.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["Scripts", "GROUP_STEPS", "lua_source", "lua_dir"]

GROUP_STEPS = (
    "join_group",
    "sync_group",
    "leave_group",
    "await_reply",
    "expire_deadlines",
    "commit_offsets",
    "fetch_offsets",
    "describe_group",
    "delete_group",
    "delete_offsets",
)
"""Steps that run behind the prelude and take the group KEYS layout."""

STANDALONE = ("due_groups", "heartbeat", "lease", "settings")
"""Scripts without the prelude: partition-level and namespace-level ones, and the heartbeat
hot path."""

INCLUDES: dict[str, tuple[str, ...]] = {
    "heartbeat": ("clock", "deadline_index"),
    "due_groups": ("clock",),
    **{f"topic_{n}": ("clock", "topic_common") for n in (
        "append", "append_idempotent", "offsets", "retention", "create_meta",
        "offset_for_time")},
    **{step: ("clock", "deadline_index", "prelude") for step in GROUP_STEPS},
}
"""Shared files put in front of a script, in order (Redis scripts cannot import)."""


def lua_dir() -> Path:
    """Where the .lua files are: inside the wheel (rcoord/lua) or the source tree (lua/)."""
    packaged = resources.files("rcoord") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parent.parent / "lua"
    if source.is_dir():
        return source
    raise FileNotFoundError("rcoord's Lua scripts are missing: neither rcoord/lua nor lua/ exists")


def lua_source(name: str) -> str:
    """The full source sent to Redis for script ``name``."""
    base = lua_dir()
    parts = [(base / f"{inc}.lua").read_text() for inc in INCLUDES.get(name, ())]
    parts.append((base / f"{name}.lua").read_text())
    return "\n".join(parts)


class Scripts:
    """The registered scripts of one Redis client."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._scripts: dict[str, Any] = {}

    @property
    def loaded(self) -> bool:
        return bool(self._scripts)

    def load(self) -> None:
        for name in GROUP_STEPS + STANDALONE:
            self._scripts[name] = self._client.register_script(lua_source(name))

    def __getattr__(self, name: str) -> Any:
        scripts = self.__dict__.get("_scripts", {})
        if name in scripts:
            return scripts[name]
        if name in GROUP_STEPS + STANDALONE:
            raise RuntimeError(f"script {name!r} used before Scripts.load()")
        raise AttributeError(name)

    def sha(self, name: str) -> str:
        if name not in self._scripts:
            raise RuntimeError(f"script {name!r} used before Scripts.load()")
        return str(self._scripts[name].sha)
