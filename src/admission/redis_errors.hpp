// Redis error replies as the shared limiter (RedisLimiter) reads them: the
// one line an outage is logged with, and which errors are about one key's
// data rather than Redis (an outage).
#pragma once

#include <string>
#include <string_view>

#include "store/resp.hpp"

namespace weir::admission {

// Why a sync failed, for the one log line of an outage: the error reply's
// first sentence, at most 120 characters, or what happened to the connection.
std::string outage_reason(const store::Error& e);

// True when a Redis error reply (`message`, as store::Error holds it) is
// about the data of the one key a script worked on (WRONGTYPE; "hash value
// is not an integer"; a Lua runtime error such as arithmetic on a field
// that does not parse), not about Redis as a whole: false for connection
// errors' messages and for replies that name a Redis-wide condition (OOM,
// READONLY, MISCONF, LOADING, BUSY, NOAUTH, NOPERM, ...), also when a
// script relays them. Such an error fails that scope's sync only.
bool key_data_error(std::string_view message);

}  // namespace weir::admission
