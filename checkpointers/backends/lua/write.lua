-- KEYS: r n x t seq
-- ARGV: ttl_ms nputs ndeletes, then 9 per put:
--         name mode(u/c/a/i/s) if_match etag digest pairs tags_json ancestors value
--       then 4 per delete: name has_if_match(0/1) if_match ancestors,
--       then 2 per guard: name "\n<etag>\n<digest>\n<pairs>\n" (the rest of ARGV)
-- A guard is an IF_MATCH put whose etag is its if_match (a lease guard: "the
-- record is still this one"), sent on its own so that it costs two
-- arguments, not nine, and one comparison when it holds (a nine-argument
-- guard cost ~20k more instructions a call). The client sends guards only
-- when they come before every put of the batch, and they are checked before
-- the puts, in that order, so the first failure is the one the nine-argument
-- form reports (its index counts the guards last: puts, deletes, guards). A
-- guard holds when the stored record carries its etag, digest and tag pairs:
-- it is kept as stored (nothing written, no seq), and its stored metadata
-- follows the puts' in the reply.
-- A tags_json ending "\n=" or "\n~" (the value raw or compressed) says the
-- value goes inline: appended to the metadata in its "m:<name>" field, with
-- no "v:<name>" (one left by an earlier record of that name goes).
-- Mode "s" is a staged put (an append) whose value the client already sent
-- with HSETNX into "v:<name>" in the same pipeline: its value argument is
-- empty and the script never touches "v:<name>" on success.
-- Returns {0, index, stored meta, stored value, now_empty} for a refused batch,
--         {4} when a guard's record carries its etag but not its digest or tag
--             pairs (nothing was applied: re-send it as a nine-argument put,
--             which writes it),
--         {2} when a staged value is not there (a concurrent delete removed it
--             between the HSETNX and the script; nothing was applied: re-send
--             with the values inline),
--         {3, name, reason, meta} when the batch meets damaged stored data
--             (nothing was applied; see guarded()),
--         {1, was_empty, now_empty, meta of put 1, meta of put 2, ..., then
--             of guard 1, ...} otherwise.
-- An IF_MATCH put whose etag is its if_match and whose digest and tag pairs
-- are the stored record's is kept as stored, like an append of the same
-- digest (its metadata returned, nothing written, no new seq).
-- Append mode compares content digests: the part before the first "." (a
-- seal may follow it; see backends.base.content_digest).
local r, n, x, t, seqkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
-- ARGV in a local (a global lookup per use otherwise); counts by coercion
-- ("+ 0" costs a third of a tonumber() call)
local A = ARGV
local ttl, np, nd = A[1], A[2] + 0, A[3] + 0
local PW, DW = 9, 4
local D0 = 3 + np * PW
local GW, G0 = 2, D0 + nd * DW
local ng = (#A - G0) / GW
-- after damage stopped the batch: the staged values it sent ahead whose
-- record is absent go again, as on a refusal
local function drop_orphans()
  for k = 0, np - 1 do
    local b = 3 + k * PW
    if A[b + 2] == "s" and redis.call("HEXISTS", r, "m:" .. A[b + 1]) == 0 then
      redis.call("HDEL", r, "v:" .. A[b + 1])
    end
  end
end
return guarded(3, function()
-- 1. read what is stored (one HMGET) and check every condition; refuse the
--    whole batch at the first failure. Record k (0-based like the conflict
--    index: puts, then deletes) is stored[k + 1], false where absent.
local fields = {nil, nil}  -- room for two (see step 2 on presized lists)
for i = 1, np do fields[i] = "m:" .. A[i * PW - 5] end
for j = 1, nd do fields[np + j] = "m:" .. A[D0 + j * DW - 3] end
for g = 1, ng do fields[np + nd + g] = "m:" .. A[G0 + g * GW - 1] end
local stored = many("HMGET", r, fields)
-- every stored record's fields, parsed once: parsed[k + 1] = {seq, etag,
-- digest, pairs, where the pairs end}, false if damaged. A damaged record
-- can still be replaced (upsert) or deleted without a condition: its index
-- members are then found by scanning the indexes. A condition on it cannot
-- be checked: damage aborts here, before anything is written.
local parsed = {}
for k = 1, np + nd do
  local meta = stored[k]
  if meta then
    local seq, etag, digest, pairs, pairs_end = parse_meta(meta)
    if seq and (pairs == "" or not string.find(pairs, "[^%w_%%=%- ]")) then
      parsed[k] = {seq, etag, digest, pairs, pairs_end}
    else
      local name, unconditional
      if k <= np then
        name, unconditional = A[k * PW - 5], A[k * PW - 4] == "u"
      else
        name, unconditional = A[D0 + (k - np) * DW - 3], A[D0 + (k - np) * DW - 2] == "0"
      end
      if not unconditional then corrupt(name, "its metadata is not seq, etag, digest, tag pairs, tags", meta) end
      parsed[k] = false
    end
  end
end
local noop = {false, false}  -- presized too
local function refuse(k, name)
  local empty = redis.call("EXISTS", n) == 0 and 1 or 0
  local out = {0, k - 1, stored[k], redis.call("HGET", r, "v:" .. name), empty}
  -- the staged values this batch sent ahead and nothing refers to: gone
  -- again (a concurrent batch that counted on one re-sends it, see {2})
  local orphans = {}
  for i = 1, np do
    if A[i * PW - 4] == "s" and not stored[i] then
      orphans[#orphans + 1] = "v:" .. A[i * PW - 5]
    end
  end
  apply("HDEL", r, orphans)
  return out
end
for g = 1, ng do
  local b, k = G0 + (g - 1) * GW, np + nd + g
  local name, want, meta = A[b + 1], A[b + 2], stored[k]
  if not meta then return refuse(k, name) end
  -- held: the stored etag, digest and pairs are the guard's (one comparison,
  -- right after the seq); else parsed in full, damage aborting as for a put
  local at = string.find(meta, "\n", 1, true)
  if not (at and string.sub(meta, at, at + #want - 1) == want and string.find(meta, "^%d+\n")) then
    local _, etag, digest, pairs = meta_parts(name, meta)
    if pairs ~= "" and string.find(pairs, "[^%w_%%=%- ]") then corrupt(name, META_DAMAGE, meta) end
    local e = string.find(want, "\n", 2, true)
    if etag ~= string.sub(want, 2, e - 1) then return refuse(k, name) end
    return {4}
  end
end
for i = 1, np do
  local b = i * PW - 6
  local name, mode, meta = A[b + 1], A[b + 2], stored[i]
  if mode == "c" and meta then return refuse(i, name) end
  if mode == "i" then
    if not meta then return refuse(i, name) end
    local p = parsed[i]
    if p[2] ~= A[b + 3] then return refuse(i, name) end
    -- an unchanged re-put under its own etag (a lease guard): same etag,
    -- digest and tag pairs hold exactly the stored record; kept as it is
    if A[b + 4] == A[b + 3] and p[3] == A[b + 5] and p[4] == A[b + 6] then
      noop[i] = true
    end
  end
  if (mode == "a" or mode == "s") and meta then
    local have, want = parsed[i][3], A[b + 5]
    if have ~= want and string.match(have, "^[^.]*") ~= string.match(want, "^[^.]*") then
      return refuse(i, name)
    end
    noop[i] = true
  end
end
for j = 1, nd do
  local b = D0 + (j - 1) * DW
  if A[b + 2] == "1" then
    if not stored[np + j] then return refuse(np + j, A[b + 1]) end
    if parsed[np + j][2] ~= A[b + 3] then return refuse(np + j, A[b + 1]) end
  end
end
for i = 1, np do
  local b = i * PW - 6
  if A[b + 2] == "s" and not noop[i] and redis.call("HEXISTS", r, "v:" .. A[b + 1]) == 0 then
    return {2}
  end
end

-- 2. apply: collect every index change, then one command per key (old
--    index members go before new ones, which may be equal to them). The
--    lists of old members and removed fields are made when first needed
--    (most batches have none; an empty table costs a short command's worth).
--    The lists most batches fill start with room for one put's pair (a
--    table filled from {} rehashes on each growth; "#" still counts from 1)
local x_new, n_new, r_new = {nil, nil}, {nil, nil}, {nil, nil}
local t_new, x_old, t_old, gone
local function unindex(name, k, ancestors)  -- the index members of stored record k
  x_old, t_old = x_old or {}, t_old or {}
  local p = parsed[k]
  if not p then
    -- members end with "|" .. name (a name has no "|"): a scan, paid only
    -- when damage is being overwritten
    local tail = "|" .. name
    for _, m in ipairs(redis.call("ZRANGE", x, 0, -1)) do
      if string.sub(m, -#tail) == tail then x_old[#x_old + 1] = m end
    end
    for _, m in ipairs(redis.call("ZRANGE", t, 0, -1)) do
      if string.sub(m, -#tail) == tail then t_old[#t_old + 1] = m end
    end
    return
  end
  local s, pairs = pad(p[1]), p[4]
  for a in string.gmatch(ancestors, "[^ ]+") do x_old[#x_old + 1] = a .. "|" .. s .. "|" .. name end
  if pairs ~= "" then
    for tp in string.gmatch(pairs, "[^ ]+") do
      t_old[#t_old + 1] = "s" .. tp .. "|" .. s .. "|" .. name
      t_old[#t_old + 1] = "n" .. tp .. "|" .. name
    end
  end
end
local applied = 0
for i = 1, np do if not noop[i] then applied = applied + 1 end end
-- was it empty? Its seq counter says so without one more command: every
-- applied put creates the counter, and whatever empties a partition removes
-- it too (step 3 below, drop, a ttl expiring all the keys at once). A batch
-- that applies no put cannot fill an empty partition: 0 is right for it.
local out = {1, 0, 0, nil, nil}  -- room for two puts' metadata
local seq = 0
if applied > 0 then
  seq = redis.call("INCRBY", seqkey, applied) - applied
  if seq == 0 then out[2] = 1 end
end
for i = 1, np do
  local b = i * PW - 6
  local name, pairs, ancestors = A[b + 1], A[b + 6], A[b + 8]
  if noop[i] then
    out[#out + 1] = meta_only(stored[i], parsed[i][5])  -- the client takes the value from the put
  else
    if stored[i] then unindex(name, i, ancestors) end
    seq = seq + 1
    local s = pad(seq)
    local tj = A[b + 7]
    local meta = seq .. "\n" .. A[b + 4] .. "\n" .. A[b + 5] .. "\n" .. pairs .. "\n" .. tj
    local nl, how = string.byte(tj, -2, -1)
    if nl == 10 and (how == 61 or how == 126) then  -- "\n=" or "\n~": the value goes inline
      push(r_new, "m:" .. name, meta .. A[b + 9])
      if stored[i] then
        gone = gone or {}
        gone[#gone + 1] = "v:" .. name
      end
    else
      push(r_new, "m:" .. name, meta)
      if A[b + 2] ~= "s" then push(r_new, "v:" .. name, A[b + 9]) end
    end
    -- scores are the string "0": a Lua number would be formatted for every member
    push(n_new, "0", name)
    -- ancestors: one as a rule (a gmatch iterator costs several finds)
    if not string.find(ancestors, " ", 1, true) then
      if ancestors ~= "" then push(x_new, "0", ancestors .. "|" .. s .. "|" .. name) end
    else
      for a in string.gmatch(ancestors, "[^ ]+") do push(x_new, "0", a .. "|" .. s .. "|" .. name) end
    end
    if pairs ~= "" then
      t_new = t_new or {nil, nil, nil, nil}
      for tp in string.gmatch(pairs, "[^ ]+") do
        push(t_new, "0", "s" .. tp .. "|" .. s .. "|" .. name)
        push(t_new, "0", "n" .. tp .. "|" .. name)
      end
    end
    out[#out + 1] = meta
  end
end
local n_old
for j = 1, nd do
  local b = D0 + (j - 1) * DW
  local name = A[b + 1]
  if stored[np + j] then
    unindex(name, np + j, A[b + 4])
    gone = gone or {}
    push(gone, "m:" .. name, "v:" .. name)
    n_old = n_old or {}
    n_old[#n_old + 1] = name
  end
end
for g = 1, ng do out[#out + 1] = stored[np + nd + g] end
apply("ZREM", x, x_old)
apply("ZREM", t, t_old)
apply("ZREM", n, n_old)
apply("HDEL", r, gone)
apply("HSET", r, r_new)
apply("ZADD", n, n_new)
apply("ZADD", x, x_new)
apply("ZADD", t, t_new)

-- 3. an empty partition keeps no keys; a live one gets its expiry refreshed
--    (a batch that stored a put cannot have left it empty); a write without
--    a ttl leaves none (one PTTL when there is nothing to clear)
if (nd > 0 or np == 0) and redis.call("EXISTS", n) == 0 then
  out[3] = 1
  redis.call("DEL", seqkey)
elseif ttl ~= "0" then
  for _, k in ipairs(KEYS) do redis.call("PEXPIRE", k, ttl) end
elseif redis.call("PTTL", n) > 0 then
  for _, k in ipairs(KEYS) do redis.call("PERSIST", k) end
end
return out
end, drop_orphans)
