-- clock.lua: the one clock, put in front of every script that needs "now" (rcoord/scripts.py).
-- Redis TIME in ms, unless the caller passes an explicit now (only the test clock, MockTime,
-- does; like Kafka's MockTime). Returns the time and whether it was passed in.

local function read_clock(now_arg)
  if now_arg ~= nil and now_arg ~= '' then return tonumber(now_arg), true end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), false
end
