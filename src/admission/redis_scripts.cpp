#include "admission/redis_scripts.hpp"

namespace weir::admission {

namespace {
// The lease and slots scripts' first step on their hash KEYS[1]: a key that
// holds another type (a string or a list some other writer left) is deleted,
// taken as missing, and `bad` says so for the reply ('' = nothing reset).
constexpr const char* kResetUnlessHash = R"lua(local bad = ''
local ty = redis.call('TYPE', KEYS[1]).ok
if ty ~= 'hash' and ty ~= 'none' then
  redis.call('DEL', KEYS[1])
  bad = KEYS[1] .. ' held a ' .. ty .. ', not a hash'
end
)lua";

// The slots and budget scripts' bound on one hash (kMaxHashFields,
// redis_scripts.hpp): `n` = HLEN (through pcall: an ACL user without +hlen,
// given before this bound existed, still works, without it). A hash past the
// bound is bad data: the caller resets it.
// drop(k) deletes a key with UNLINK (its memory freed in the background: a
// DEL of a 300,000-field hash blocks Redis ~300 ms, UNLINK ~35 ms), or DEL
// where UNLINK is refused (an ACL without +unlink).
constexpr const char* kTooBig = R"lua(local MAXF = 4096
local function too_big(k)
  local n = redis.pcall('HLEN', k)
  if type(n) == 'number' and n > MAXF then return n end
  return nil
end
local function drop(k)
  local r = redis.pcall('UNLINK', k)
  if type(r) == 'table' and r.err then redis.call('DEL', k) end
end
)lua";

// How far ahead of Redis TIME an entry's expiry may lie: Weir writes now +
// slot_ttl; a replica whose slot_ttl is up to twice this one's, and a minute
// of slack, pass. Beyond that (a hand-written "held:99999999999999") is bad
// data, which would otherwise be honoured forever (every renewal re-PEXPIREs
// the hash).
constexpr const char* kFarExpiry = R"lua(local function far(exp) return exp > now + 2 * ttl + 60000 end
)lua";
}  // namespace

// Token bucket lease. The global bucket lives in one hash: v = units
// available (a float; negative while in debt), t = Redis TIME (µs) of the
// last update. It refills by elapsed Redis time (never a replica's clock),
// takes back unused units (capped at full), books debt, then grants
// min(ask, whole units available). A missing key is a full bucket; the key
// expires once it would be full again. A key that holds something else (a
// string or a list some other writer left, fields that are not numbers) is
// data loss of one bucket, not an error: it is taken as missing and
// overwritten, and the reply says so (the limiter logs it).
// KEYS[1] bucket; ARGV: rate (units/min), depth, ask, put, owe.
// Returns {granted, floor(units left), ms until full, what was reset ('' = nothing)}.
const store::Script& lease_script() {
  static const store::Script s(std::string(R"lua(
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local rate = tonumber(ARGV[1]) / 60000000
local depth = tonumber(ARGV[2])
local ask = tonumber(ARGV[3])
local put = tonumber(ARGV[4])
local owe = tonumber(ARGV[5])
)lua") + kResetUnlessHash + R"lua(local function num(x)
  local n = tonumber(x)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return nil end
  return n
end
local s = redis.call('HMGET', KEYS[1], 'v', 't')
local v = num(s[1])
local last = num(s[2])
if v == nil or last == nil then
  if bad == '' and (s[1] or s[2]) then bad = KEYS[1] .. ' held fields v, t that are not numbers' end
  v = depth
else
  v = math.min(depth, v + math.max(0, now - last) * rate)
end
v = math.min(depth, v + put) - owe
local grant = 0
if ask > 0 and v >= 1 then grant = math.min(ask, math.floor(v)) end
v = v - grant
local full_ms = 0
if v < depth then full_ms = math.ceil((depth - v) / rate / 1000) end
redis.call('HSET', KEYS[1], 'v', string.format('%.17g', v), 't', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], full_ms + 1000)
return {grant, math.floor(v), full_ms, bad}
)lua");
  return s;
}

// Stream slot lease. One hash per scope: replica id ->
// "held:expiry_ms:want:in_use:demand". Entries past their expiry (a replica
// that stopped renewing: crashed or partitioned) are dropped; a replica gets
// min(want, limit - others) and is recorded at no less than `floor` (what it
// may be using until it hears the answer: its allowance when it asked, or
// its streams in flight if more). Fair share: while another live replica
// has demand (requests waiting for or refused a slot) and holds less than
// it wants, a replica is granted at most floor(limit / replicas wanting),
// or, when it has demand of its own, up to min(in use + demand,
// ceil(limit / replicas wanting)): a busy replica cannot keep a small cap to
// itself (it shrinks to its share as its streams end), and an idle one gives
// its spare slots back at once (a cap of 1 moves to the replica that needs it).
// KEYS[1] hash; ARGV: replica id, want, floor, limit, ttl ms, in use, demand.
// (Entries of three fields, from an older Weir: in use = held, demand = want > held.)
// An entry that does not parse, or expires more than 2 x ttl + 60 s ahead
// (kFarExpiry), is dropped; a key that is no hash, or has more than 4096
// fields (kTooBig), is taken as missing and overwritten (as lease.lua).
// Returns {granted, slots held by the other live replicas, replicas starved,
// slots the other live replicas have in use, what was reset ('' = nothing)}.
const store::Script& slots_script() {
  static const store::Script s(std::string(R"lua(
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local id = ARGV[1]
local want = tonumber(ARGV[2])
local inuse = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local used = tonumber(ARGV[6] or ARGV[3])
local demand = tonumber(ARGV[7] or '0')
)lua") + kResetUnlessHash + kTooBig +
                               kFarExpiry + R"lua(local n = too_big(KEYS[1])
if n then
  drop(KEYS[1])
  if bad == '' then bad = KEYS[1] .. ' held ' .. n .. ' entries (more than ' .. MAXF .. ')' end
end
local all = redis.call('HGETALL', KEYS[1])
local others, others_used, starved, wanting = 0, 0, 0, 1
for i = 1, #all, 2 do
  if all[i] ~= id then
    local held, exp, w, u, d = string.match(all[i + 1], '^(%d+):(%d+):?(%d*):?(%d*):?(%d*)$')
    if held and far(tonumber(exp)) then
      if bad == '' then
        bad = KEYS[1] .. ' entry ' .. all[i] .. ' expiring ' .. string.format('%.0f', tonumber(exp) - now) ..
          ' ms ahead (more than 2 x slot_ttl + 60 s)'
      end
      held = nil
    end
    if held and tonumber(exp) > now then
      held = tonumber(held)
      others = others + held
      w = tonumber(w) or 0
      others_used = others_used + math.min(held, tonumber(u) or held)
      d = tonumber(d)
      if d == nil then d = (w > held) and 1 or 0 end
      if w > 0 then wanting = wanting + 1 end
      if d > 0 and w > held then starved = starved + 1 end
    else
      redis.call('HDEL', KEYS[1], all[i])
    end
  end
end
local grant = math.max(0, math.min(want, limit - others))
if starved > 0 then
  local cap = math.floor(limit / wanting)
  if demand > 0 then cap = math.max(cap, math.min(used + demand, math.ceil(limit / wanting))) end
  grant = math.min(grant, cap)
end
local hold = math.max(grant, inuse)
if hold > 0 or want > 0 then
  redis.call('HSET', KEYS[1], id, string.format('%.0f:%.0f:%.0f:%.0f:%.0f', hold, now + ttl, want, used, demand))
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
else
  redis.call('HDEL', KEYS[1], id)
end
return {grant, others, starved, others_used, bad}
)lua");
  return s;
}

// Budget: settled spend and reservations. One hash per (scope, period),
// period = floor(Redis ms / period_ms) (UTC-aligned; 0 forever when
// period_ms = 0), holding
//   total     settled spend of every replica in the period (nano-USD)
//   s:<id>    that replica's running total of settled spend (a push sets it
//             to max(old, cum) and adds the difference to total, so a
//             retried push counts once)
//   t:<id>    Redis ms of that replica's last push: an s:<id> whose t: is
//             older than max(1 day, 100 x ttl) (its process gone: ids are per
//             process) is dropped with it (total counts it already), so a
//             hash that never expires (period 0) does not keep a field per
//             replica ever started; an s: without a t: is stamped now
//   a:<id>    "allowance:expiry_ms": what that replica may hold in
//             reservations of requests in flight plus settled spend it has not
//             pushed yet. Dropped once expired (a crashed replica's share
//             comes back after ttl).
// A replica asks for `want` and is granted max(in_use, min(want, limit -
// total - the others' live allowances)): the allowances and the spend add up
// to at most the limit (requests already in flight keep what they reserved),
// so replicas cannot overspend concurrently.
// A calendar period (calendar = 1 day, 2 ISO week, 3 month; core/calendar.hpp)
// counts windows of Redis TIME plus `offset` ms: period = days since
// 1970-01-01, ISO weeks since Monday 1969-12-29, or months since 1970-01 of
// that local time (the month from Hinnant's civil_from_days), its hash
// named <base>:d<period>, :w<period> or :m<period>; so every replica, and
// the in-process limiter, agree on the window and its end.
// KEYS[1] base key; ARGV: replica id, period ms, period of cum (-1: none),
// cum (nano-USD), in use (nano-USD), want (nano-USD), limit (nano-USD), ttl ms,
// calendar (0 = none: period ms applies), offset ms (east of UTC), then any number of
// members folded into this one (RedisLimiter::fold_retired: retired scopes of this replica): in the
// hash of the period of cum, each one's s: is added to this replica's and its s:, t: and a: go (total
// counts it already; idempotent: a retried push finds nothing left to merge).
// A period's key that is no hash, or whose `total` or this replica's `s:`
// is not an integer, is deleted before use: the period's spend is then
// lost as in a Redis that lost its data, and the replicas re-seed it (each
// pushes its running total again: at once here, within slot_ttl / 3 on the
// others). The reply says what was reset.
// Returns {granted, total, this replica's s:, period, ms left (-1 = never),
// others' allowances, what was reset ('' = nothing)}. An allowance expiring
// more than 2 x ttl + 60 s ahead is dropped as bad data; a hash of more
// than 4096 fields keeps only its `total`.
const store::Script& budget_script() {
  static const store::Script s(std::string(R"lua(
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local id = ARGV[1]
local period = tonumber(ARGV[2])
local claimed = tonumber(ARGV[3])
local cum = tonumber(ARGV[4])
local inuse = tonumber(ARGV[5])
local want = tonumber(ARGV[6])
local limit = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local cal = tonumber(ARGV[9] or '0')
local offset = tonumber(ARGV[10] or '0')
local idx, left, tag, span = 0, -1, '', period
local DAY = 86400000
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return y, m
end
if cal > 0 then
  local t = now + offset
  local day = math.floor(t / DAY)
  local first, nxt
  if cal == 1 then
    idx, first, nxt, tag, span = day, day, day + 1, 'd', DAY
  elseif cal == 2 then
    idx = math.floor((day + 3) / 7)
    first = idx * 7 - 3
    nxt, tag, span = first + 7, 'w', 7 * DAY
  else
    local y, m = civil_from_days(day)
    idx = (y - 1970) * 12 + m - 1
    if m == 12 then nxt = days_from_civil(y + 1, 1, 1) else nxt = days_from_civil(y, m + 1, 1) end
    tag, span = 'm', 31 * DAY
  end
  left = nxt * DAY - t
elseif period > 0 then
  idx = math.floor(now / period)
  left = (idx + 1) * period - now
end
local function key(i) return KEYS[1] .. ':' .. tag .. string.format('%.0f', i) end
local bad = ''
)lua") + kTooBig + kFarExpiry + R"lua(local FOLD = math.max(86400000, 100 * ttl)
local function check(k)
  local ty = redis.call('TYPE', k).ok
  local why = nil
  if ty ~= 'hash' and ty ~= 'none' then
    why = 'a ' .. ty .. ', not a hash'
  elseif ty == 'hash' then
    local names = {'total', 's:' .. id}
    local f = redis.call('HMGET', k, names[1], names[2])
    for j = 1, 2 do
      if f[j] and not (string.match(f[j], '^%d+$') and #f[j] <= 18) then
        why = 'a field ' .. names[j] .. ' that is not an integer'
      end
    end
  end
  if why then
    redis.call('DEL', k)
    if bad == '' then bad = k .. ' held ' .. why end
  elseif ty == 'hash' then
    -- Past the bound: every field but `total` goes (the replicas' running totals and allowances; total keeps
    -- their spend, and the live replicas' pushes add theirs again: an overcount, never an overspend).
    local n = too_big(k)
    if n then
      local t = redis.call('HGET', k, 'total')
      drop(k)
      if t then
        redis.call('HSET', k, 'total', t)
        if span > 0 then redis.call('PEXPIRE', k, 2 * span + 60000) end
      end
      if bad == '' then bad = k .. ' held ' .. n .. ' fields (more than ' .. MAXF .. ')' end
    end
  end
end
if claimed >= 0 and (cum > 0 or #ARGV > 10) then
  local k = key(claimed)
  check(k)
  -- Members folded into this one (retired scopes of this replica): each one's running total joins this
  -- one's, its fields go; `total` counts it already. Again (a retried push) finds nothing to merge.
  for j = 11, #ARGV do
    local m = ARGV[j]
    if m ~= id then
      local v = redis.call('HGET', k, 's:' .. m)
      if v and string.match(v, '^%d+$') and #v <= 18 then redis.call('HINCRBY', k, 's:' .. id, v) end
      redis.call('HDEL', k, 's:' .. m, 't:' .. m, 'a:' .. m)
    end
  end
  local old = tonumber(redis.call('HGET', k, 's:' .. id) or '0')
  if cum > old then
    redis.call('HINCRBY', k, 'total', string.format('%.0f', cum - old))
    redis.call('HSET', k, 's:' .. id, ARGV[4])
    if span > 0 then redis.call('PEXPIRE', k, 2 * span + 60000) end
  end
  if cum > 0 or old > 0 then redis.call('HSET', k, 't:' .. id, string.format('%.0f', now)) end
end
local k = key(idx)
if idx ~= claimed or cum <= 0 then check(k) end
local all = redis.call('HGETALL', k)
local total, mine, others = 0, 0, 0
local me = 'a:' .. id
-- t:<member>: Redis ms of that member's last push (every slot_ttl / 3 while it has spend). A running total
-- s:<member> whose member has not pushed for FOLD (a replica that exited or crashed: ids are per process) is
-- dropped with its t:; `total` already counts it. One without a t: (written before t: existed) is stamped now.
local seen = {}
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 't:' then seen[string.sub(all[i], 3)] = tonumber(all[i + 1]) end
end
for i = 1, #all, 2 do
  local f = all[i]
  local pre = string.sub(f, 1, 2)
  if f == 'total' then
    total = tonumber(all[i + 1])
  elseif f == 's:' .. id then
    mine = tonumber(all[i + 1])
  elseif pre == 's:' then
    local m = string.sub(f, 3)
    local t = seen[m]
    if t == nil or t > now then
      redis.call('HSET', k, 't:' .. m, string.format('%.0f', now))
    elseif now - t > FOLD then
      redis.call('HDEL', k, f, 't:' .. m)
    end
    seen[m] = false
  elseif pre == 'a:' and f ~= me then
    local held, exp = string.match(all[i + 1], '^(%d+):(%d+)$')
    if held and far(tonumber(exp)) then
      if bad == '' then
        bad = k .. ' field ' .. f .. ' expiring ' .. string.format('%.0f', tonumber(exp) - now) ..
          ' ms ahead (more than 2 x slot_ttl + 60 s)'
      end
      held = nil
    end
    if held and tonumber(exp) > now then
      others = others + tonumber(held)
    else
      redis.call('HDEL', k, f)
    end
  end
end
-- A t: without its s: (the s: was folded or reset) goes too.
for m, t in pairs(seen) do
  if t and m ~= id then redis.call('HDEL', k, 't:' .. m) end
end
local grant = math.max(inuse, math.min(want, limit - total - others))
if grant > 0 then
  redis.call('HSET', k, me, string.format('%.0f:%.0f', grant, now + ttl))
  if span > 0 then redis.call('PEXPIRE', k, 2 * span + 60000) end
else
  redis.call('HDEL', k, me)
end
return {grant, total, mine, idx, left, others, bad}
)lua");
  return s;
}

// The outage probe (redis_sync.cpp): a write through EVALSHA, as the other
// scripts are, so it fails when they would. KEYS[1] a key; ARGV: ttl ms.
const store::Script& probe_script() {
  static const store::Script s(R"lua(
redis.call('SET', KEYS[1], '1', 'PX', tonumber(ARGV[1]))
return 1
)lua");
  return s;
}

}  // namespace weir::admission
