"""Copies of the rcoord library under other names, for tests and benches that compare a changed
library with the real one on the same server (a copy's functions are registered under its own
prefix, so it loads beside the original)."""

from __future__ import annotations

from ..scripts import library_head

__all__ = ["RECORDED_FUNCTION", "library_copy", "recording_copy"]


def library_copy(name: str, source: str, copy: str, before: str = "", after: str = "") -> str:
    """The FUNCTION LOAD source of library ``name`` (``source``) under the name ``copy``, with
    Lua ``before`` its body (after the name lines) and ``after`` it."""
    head = library_head(name)
    assert source.startswith(head), "the library's first lines changed"
    return f"{library_head(copy)}{before}{source[len(head):]}{after}"


# Put in front of a copy of the library (after its name lines; the library uses only these three
# of the redis API, and a function library may not use setmetatable while it loads): every
# redis.call the steps make is noted, arguments as the server receives them (numbers as Redis
# turns them into strings), and RECORDED_FUNCTION returns the notes since its last call.
RECORDED_FUNCTION = "rcoord_testing_recorded"
_RECORDER = """
local function real_redis() return redis end -- the global, as each call finds it
local RECORDED = {}
local redis = {
  register_function = function(...) return real_redis().register_function(...) end,
  error_reply = function(...) return real_redis().error_reply(...) end,
  call = function(...)
    local cmd = {...}
    for i = 1, #cmd do
      if type(cmd[i]) == 'number' then cmd[i] = string.format('%.17g', cmd[i]) end
    end
    RECORDED[#RECORDED + 1] = cmd
    return real_redis().call(...)
  end,
}
redis.register_function('""" + RECORDED_FUNCTION + """', function()
  local out = RECORDED
  RECORDED = {}
  return out
end)
"""


def recording_copy(name: str, source: str, copy: str) -> str:
    """A copy of library ``name`` (as library_copy) whose steps note every Redis command they
    run: what a step costs in commands, or whether it reads what it just wrote, is then read
    back with ``FCALL RECORDED_FUNCTION 0`` after each call (one recording copy per server at a
    time: they share the function's name)."""
    return library_copy(name, source, copy, before=_RECORDER)
