-- KEYS: r n x t
-- ARGV: order(name/seq) desc(0/1) limit(-1 = none) values(0/1) prefix
--       name_lo name_hi has_name_hi seq_lo seq_hi ancestor
--       depth(-1 = any) children(0/1) tag...
-- Returns name, meta, value for every selected record, in order, each
-- followed by its children (with children=1); {0, name, reason, meta} when it
-- meets damaged stored data (see guarded()): a record whose value is missing,
-- whose seq is not an integer or disagrees with the seq index entry it was
-- found by, ... (the client parses and checks the rest of every record).
return guarded(0, function()
local r, n, x, t = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local by_seq, desc = ARGV[1] == "seq", ARGV[2] == "1"
local limit, values, prefix = tonumber(ARGV[3]), ARGV[4] == "1", ARGV[5]
local nlo, nhi, has_nhi = ARGV[6], ARGV[7], ARGV[8] == "1"
local slo, shi, anc = ARGV[9], ARGV[10], ARGV[11]
local depth, children = tonumber(ARGV[12]), ARGV[13] == "1"
local tags = {}
for i = 14, #ARGV do tags[#tags + 1] = ARGV[i] end

local out, count = {}, 0
local function full() return limit >= 0 and count >= limit end
-- the metadata as sent to the client: without an inline value when the
-- listing returns no values
local function sent(meta)
  if values then return meta end
  return meta_only(meta)
end
-- the children of name: "[name/" .. "(name0" in the names zset ("0" follows
-- "/"), ascending, unfiltered, not counted; one HMGET for all of them
local function emit_children(name)
  local kids = redis.call("ZRANGEBYLEX", n, "[" .. name .. "/", "(" .. name .. "0")
  if #kids == 0 then return end
  local fields = {}
  for _, kid in ipairs(kids) do
    fields[#fields + 1] = "m:" .. kid
    if values then fields[#fields + 1] = "v:" .. kid end
  end
  local got = many("HMGET", r, fields)
  local step = values and 2 or 1
  for i, kid in ipairs(kids) do
    local meta = got[(i - 1) * step + 1]
    if meta then
      local value = ""
      if values then
        value = got[i * 2]
        if not value then
          if not inline_at(meta) then corrupt(kid, "its value is missing", false) end
          value = ""
        end
      end
      out[#out + 1] = kid
      out[#out + 1] = sent(meta)
      out[#out + 1] = value
    end
  end
end
local function emit(name, meta)
  local value = ""
  if values and not inline_at(meta) then
    value = redis.call("HGET", r, "v:" .. name)
    if not value then corrupt(name, "its value is missing", false) end
  end
  out[#out + 1] = name
  out[#out + 1] = sent(meta)
  out[#out + 1] = value
  count = count + 1
  if children then emit_children(name) end
end
-- the seq field of a record's metadata, checked
local function seq_of(name, meta)
  local a = string.find(meta, "\n", 1, true)
  local seq = a and string.sub(meta, 1, a - 1)
  if not seq or not string.find(seq, "^%d+$") then corrupt(name, "its seq is not an integer", meta) end
  return seq
end
-- whether name (under prefix) has exactly depth "/" after the prefix; a
-- deeper name also returns where its ancestor at that depth ends (the
-- position of the "/" after it), so a walk in name order can skip the
-- ancestor's whole subtree
local function at_depth(name)
  if depth < 0 then return true end
  local at = #prefix
  for i = 0, depth do
    at = string.find(name, "/", at + 1, true)
    if not at then return i == depth end
  end
  return false, at
end
-- the record if it passes the filters its index did not apply, else nil;
-- seq16: the seq of the index entry it was found by (a seq index), which
-- must be the record's
local function check(name, skip_tag, check_prefix, seq16)
  if check_prefix and string.sub(name, 1, #prefix) ~= prefix then return nil end
  if not at_depth(name) then return nil end
  local meta = redis.call("HGET", r, "m:" .. name)
  if not meta then return nil end
  if seq16 and tonumber(seq_of(name, meta)) ~= tonumber(seq16) then
    corrupt(name, "its seq is not the one its seq index entry gives", meta)
  end
  if #tags > (skip_tag > 0 and 1 or 0) then
    local _, _, _, pairs = meta_parts(name, meta)
    pairs = " " .. pairs .. " "
    for i, p in ipairs(tags) do
      if i ~= skip_tag and not string.find(pairs, " " .. p .. " ", 1, true) then return nil end
    end
  elseif #tags > 0 then
    -- the walked tag is the only one: its index found the candidate, so
    -- nothing is left to compare (the client checks the tags it gets); the
    -- metadata's shape is checked without cutting its fields out (a
    -- 5,000-record list_checkpoint_ids spent a quarter of its server time
    -- on those strings and left them as garbage)
    check_meta(name, meta)
  end
  return meta
end
-- walk one lex range in order, in growing chunks, until the limit is met;
-- by_name: the index is in name order, so a subtree is one run of members
local function scan(key, lo, hi, name_at, skip_tag, check_prefix, by_name)
  local chunk = 32
  if limit >= 0 then chunk = math.max(limit, 1) end
  while true do
    local members
    if desc then
      members = redis.call("ZREVRANGEBYLEX", key, hi, lo, "LIMIT", 0, chunk)
    else
      members = redis.call("ZRANGEBYLEX", key, lo, hi, "LIMIT", 0, chunk)
    end
    for _, m in ipairs(members) do
      local name = string.sub(m, name_at)
      local meta = check(name, skip_tag, check_prefix, not by_name and string.sub(m, name_at - 17, name_at - 2))
      if meta then
        emit(name, meta)
        if full() then return end
      end
    end
    if #members < chunk then return end
    local last = members[#members]
    if desc then hi = "(" .. last else lo = "(" .. last end
    if by_name then
      -- the chunk ended inside the subtree of a name at the query depth:
      -- jump over the rest of it (in descending order, a checkpoint's
      -- writes come right before it), so the walk reads a bounded number
      -- of names below the wanted depth
      local _, cut = at_depth(string.sub(last, name_at))
      if cut then
        local base = string.sub(last, 1, name_at + cut - 2)  -- index member of that name
        if desc then hi = "[" .. base else lo = "[" .. base .. "0" end
      end
    end
    chunk = math.min(chunk * 2, 1024)
  end
end
local function seq_range(family)  -- family ends with "|"; members family..seq16.."|"..name
  local top = string.sub(family, 1, #family - 1) .. "}"
  local hi = "(" .. top
  if shi ~= "" then hi = "(" .. family .. shi end
  return "[" .. family .. slo, hi
end

-- seq order under a prefix that is not an indexed ancestor: walking the
-- ancestor's index skips the names outside the prefix; reading every name
-- under the prefix and sorting them costs their number. Pick the cheaper.
local function index_is_cheaper()
  local under = redis.call("ZLEXCOUNT", n, "[" .. prefix, "(" .. prefix .. "\255")
  if under == 0 then return false end
  local family = redis.call("ZLEXCOUNT", n, "[" .. anc, "(" .. anc .. "\255")
  local wanted = under
  if limit >= 0 and limit < under then wanted = limit end
  return wanted * family / under <= 2 * under
end

if #tags > 0 then
  -- walk the smallest tag index; check the other tags on each candidate
  local kind = by_seq and "s" or "n"
  local best, best_count = 1, -1
  for i, p in ipairs(tags) do
    local c = redis.call("ZLEXCOUNT", t, "[" .. kind .. p .. "|", "(" .. kind .. p .. "}")
    if best_count < 0 or c < best_count then best, best_count = i, c end
  end
  if best_count == 0 then return out end
  local family = kind .. tags[best] .. "|"
  if by_seq then
    local lo, hi = seq_range(family)
    scan(t, lo, hi, #family + 18, best, prefix ~= "", false)
  else
    local hi = "(" .. kind .. tags[best] .. "}"
    if has_nhi then hi = "(" .. family .. nhi end
    scan(t, "[" .. family .. nlo, hi, #family + 1, best, false, true)
  end
elseif not by_seq then
  local hi = "+"
  if has_nhi then hi = "(" .. nhi end
  local lo = "-"
  if nlo ~= "" then lo = "[" .. nlo end
  scan(n, lo, hi, 1, 0, false, true)
elseif anc == "" or (prefix ~= anc and not index_is_cheaper()) then
  -- no indexed ancestor (the whole partition has no seq index), or few
  -- names under the prefix: read them all and sort by seq
  local rows = {}
  local lo_seq = tonumber(slo) or 0
  local hi_seq = tonumber(shi)
  for _, name in ipairs(redis.call("ZRANGEBYLEX", n, "[" .. prefix, "(" .. prefix .. "\255")) do
    local meta = at_depth(name) and redis.call("HGET", r, "m:" .. name)
    if meta then
      local seq = tonumber(seq_of(name, meta))
      if seq >= lo_seq and (hi_seq == nil or seq < hi_seq) then
        rows[#rows + 1] = {seq, name, meta}
      end
    end
  end
  if desc then
    table.sort(rows, function(a, b) return a[1] > b[1] end)
  else
    table.sort(rows, function(a, b) return a[1] < b[1] end)
  end
  for _, row in ipairs(rows) do
    if full() then break end
    emit(row[2], row[3])
  end
else
  -- the seq index of the prefix's longest indexed ancestor
  local lo, hi = seq_range(anc .. "|")
  scan(x, lo, hi, #anc + 19, 0, prefix ~= anc, false)
end
return out
end)
