-- KEYS: r n x t seq ; returns how many records the partition held. A names
-- key of the wrong type (damage) counts 0 and is dropped like the others:
-- drop is how a damaged partition is cleared.
local count = redis.pcall("ZCARD", KEYS[2])
if type(count) ~= "number" then count = 0 end
redis.call("UNLINK", unpack(KEYS))
return count
