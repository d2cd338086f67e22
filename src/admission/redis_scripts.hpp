// The Lua scripts of the Redis limiter (admission/redis_limiter.hpp): the
// token-bucket lease, the stream-slot lease and the budget. Each runs
// atomically in Redis on Redis TIME (never a replica's clock); what each
// takes and returns is said above its definition in redis_scripts.cpp.
#pragma once

#include "store/resp.hpp"

namespace weir::admission {

// KEYS[1] bucket; ARGV: rate (units/min), depth, ask, put, owe.
// Returns {granted, floor(units left), ms until full}.
const store::Script& lease_script();
// KEYS[1] hash; ARGV: replica id, want, floor (held at least: what this
// replica may be using), limit, ttl ms, in use, demand (requests waiting or refused).
// Returns {granted, slots held by the other live replicas, replicas starved,
// slots the other live replicas have in use}.
const store::Script& slots_script();
// KEYS[1] base key; ARGV: replica id, period ms, period of cum (-1: none),
// cum (nano-USD), in use (nano-USD), want (nano-USD), limit (nano-USD), ttl ms,
// calendar (0 none, 1 day, 2 ISO week, 3 month), offset ms (east of UTC).
// Returns {granted, total, this replica's s:, period, ms left (-1 = never), others' allowances}.
const store::Script& budget_script();
// KEYS[1] a key of this replica's; ARGV: ttl ms. Writes it (the outage probe:
// fails as the other scripts do under OOM, READONLY, MISCONF, NOPERM...). Returns 1.
const store::Script& probe_script();

}  // namespace weir::admission
