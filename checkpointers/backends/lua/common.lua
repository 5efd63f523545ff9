-- Shared by write.lua and list.lua: the loader puts this file in front of
-- each (one script each, so one SHA and one cache entry per script).
-- Damaged stored data aborts a script with corrupt(), caught by guarded(),
-- which replies {code, name, reason, meta}: the client raises
-- CorruptItemError naming the record. Never an error reply, which the client
-- cannot tell from an outage.
local function corrupt(name, reason, meta)
  error({corrupt = name, reason = reason, meta = meta or false}, 0)
end
-- where the four first fields of a record's metadata end (seq, etag,
-- digest, tag pairs; the tags JSON after them is parsed by the client), or
-- nil when damaged (a missing field, a seq that is not an integer); cuts
-- nothing out (no garbage)
local function meta_ends(meta)
  local a = string.find(meta, "\n", 1, true)
  local b = a and string.find(meta, "\n", a + 1, true)
  local c = b and string.find(meta, "\n", b + 1, true)
  local d = c and string.find(meta, "\n", c + 1, true)
  if not d or not string.find(meta, "^%d+\n") then return nil end
  return a, b, c, d
end
-- seq, etag, digest, tag pairs of a record's metadata and where its tag
-- pairs end (see inline_at), or nil when damaged
local function parse_meta(meta)
  local a, b, c, d = meta_ends(meta)
  if not a then return nil end
  return string.sub(meta, 1, a - 1), string.sub(meta, a + 1, b - 1), string.sub(meta, b + 1, c - 1), string.sub(meta, c + 1, d - 1), d
end
local META_DAMAGE = "its metadata is not seq, etag, digest, tag pairs, tags"
-- the same, damage aborting
local function meta_parts(name, meta)
  local seq, etag, digest, pairs = parse_meta(meta)
  if not seq then corrupt(name, META_DAMAGE, meta) end
  return seq, etag, digest, pairs
end
-- the shape check of meta_parts alone, damage aborting
local function check_meta(name, meta)
  if not meta_ends(meta) then corrupt(name, META_DAMAGE, meta) end
end
-- main() with damage turned into the reply {code, name, reason, meta}: what
-- corrupt() raised, or a key of ours holding the wrong type (the key named),
-- after on_damage() (if given) tidied up; any other error is raised on
-- unchanged. Only the damage path costs more than one pcall.
local KEY_TYPES = {"hash", "zset", "zset", "zset", "string"}  -- r n x t seq
local function damage(res)
  if type(res) == "table" and res.corrupt then return {res.corrupt, res.reason, res.meta} end
  local msg = type(res) == "table" and res.err or res
  if type(msg) ~= "string" then return nil end
  if string.sub(msg, 1, 9) ~= "WRONGTYPE" and not string.find(msg, "not an integer", 1, true) then return nil end
  for i, k in ipairs(KEYS) do
    local kind = redis.call("TYPE", k).ok
    if kind ~= "none" and kind ~= KEY_TYPES[i] then
      return {k, "the Redis key holds a " .. kind .. ", not a " .. KEY_TYPES[i], false}
    end
  end
  local seq = KEYS[5] and redis.call("GET", KEYS[5])
  if seq and not string.find(seq, "^%d+$") then return {KEYS[5], "the sequence counter is not an integer", false} end
  return nil
end
local function guarded(code, main, on_damage)
  local ok, res = pcall(main)
  if ok then return res end
  local found = damage(res)
  if not found then error(res, 0) end
  if on_damage then pcall(on_damage) end
  return {code, found[1], found[2], found[3]}
end
local function pad(seq)  -- a number or a string of digits (format converts it: no tonumber())
  return string.format("%016d", seq)
end
local function push(list, a, b)
  list[#list + 1] = a
  list[#list + 1] = b
end
-- one command over a long argument list, in chunks that unpack() can take;
-- returns the concatenated replies of the chunks (the reply itself when
-- there is one chunk: no copy)
local function many(cmd, key, args)
  if #args > 0 and #args <= 4000 then return redis.call(cmd, key, unpack(args)) end
  local out = {}
  for s = 1, #args, 4000 do
    local reply = redis.call(cmd, key, unpack(args, s, math.min(s + 3999, #args)))
    if type(reply) == "table" then
      for _, v in ipairs(reply) do out[#out + 1] = v end
    end
  end
  return out
end
-- the same for a command whose replies are not needed (no result table: a
-- Lua table costs as much as a short redis.call's argument handling);
-- args nil: nothing to send
local function apply(cmd, key, args)
  if not args then return end
  if #args <= 4000 then
    if #args > 0 then redis.call(cmd, key, unpack(args)) end
    return
  end
  for s = 1, #args, 4000 do
    redis.call(cmd, key, unpack(args, s, math.min(s + 3999, #args)))
  end
end
-- where the line holding an inline value starts in a record's metadata (the
-- newline after its tags JSON, followed by "=" or "~"; the client splits the
-- field the same way), or nil: the value is in "v:<name>". pairs_end: where
-- the tag pairs end, if known (parse_meta's fifth result): one find, not five
local function inline_at(meta, pairs_end)
  local at, lines = 0, 5
  if pairs_end then at, lines = pairs_end, 1 end
  for _ = 1, lines do
    at = string.find(meta, "\n", at + 1, true)
    if not at then return nil end
  end
  local c = string.byte(meta, at + 1)
  if c == 61 or c == 126 then return at end
  return nil
end
-- a record's metadata without its inline value: what a reply that returns
-- no value carries (a listing without values, a kept put's record)
local function meta_only(meta, pairs_end)
  local at = inline_at(meta, pairs_end)
  if at then return string.sub(meta, 1, at - 1) end
  return meta
end
