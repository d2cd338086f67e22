// Redis error replies: which end a sync as an outage and which fail one
// scope's key only (redis_errors.hpp).
#include "admission/redis_errors.hpp"

#include <fmt/format.h>

namespace weir::admission {

// Why a sync failed, for the one log line of an outage: the error reply's
// first sentence (MISCONF's is ~450 characters), or what happened to the
// connection. Every command Weir sends is one of its own scripts (NOSCRIPT
// is answered by the client, which loads the script and resends), so an
// error reply — OOM, READONLY, MISCONF, NOREPLICAS, NOPERM, an unknown
// command (a renamed EVALSHA) — means Redis cannot do the limiter's work,
// not that one request was wrong; except the errors key_data_error() names.
std::string outage_reason(const store::Error& e) {
  if (e.message.empty()) return std::string(store::to_string(e.code));
  std::string_view m = e.message;
  if (const auto dot = m.find(". "); dot != std::string_view::npos) m = m.substr(0, dot);
  if (const auto nl = m.find_first_of("\r\n"); nl != std::string_view::npos) m = m.substr(0, nl);
  constexpr std::size_t kMax = 120;
  if (m.size() > kMax) return fmt::format("{}...", m.substr(0, kMax));
  return std::string(m);
}

// True when an error reply is about the data of the one key a script
// worked on (WRONGTYPE, a field that is not an integer, a Lua runtime error
// such data causes), not about Redis: that scope's sync fails, the replica
// is no less able to use Redis for the others (the scripts reset such keys
// themselves; this is the guard for what they do not foresee). An error
// that names a Redis-wide condition, also when a script relays it, is not.
bool key_data_error(std::string_view m) {
  static constexpr std::string_view kWide[] = {"OOM",         "READONLY", "MISCONF",   "LOADING",    "BUSY",
                                               "NOAUTH",      "NOPERM",   "WRONGPASS", "NOREPLICAS", "MASTERDOWN",
                                               "CLUSTERDOWN", "TRYAGAIN", "NOSCRIPT",  "EXECABORT"};
  for (std::string_view w : kWide) {
    if (m.starts_with(w)) return false;
    for (std::string_view sep : {": ", ": -"})
      for (std::size_t at = m.find(sep); at != std::string_view::npos; at = m.find(sep, at + 1)) {
        const std::string_view rest = m.substr(at + sep.size());
        if (rest.starts_with(w) && (rest.size() == w.size() || rest[w.size()] == ' ')) return false;
      }
  }
  if (m.starts_with("WRONGTYPE")) return true;
  if (!m.starts_with("ERR ")) return false;
  // An ACL refusal relayed from a script (Redis 7: "ERR The user executing
  // the script can't run this command or subcommand ...", "... can't access
  // at least one of the keys ..."; "no permissions" in older wording) is
  // NOPERM: the user cannot do the limiter's work, whatever the key's data.
  for (std::string_view acl : {"can't run this command", "can't access at least one of the keys",
                               "can't access at least one of the channels", "no permissions"})
    if (m.find(acl) != std::string_view::npos) return false;
  return m.find("not an integer") != std::string_view::npos || m.find("not a valid float") != std::string_view::npos ||
         m.find("would overflow") != std::string_view::npos || m.find("user_script:") != std::string_view::npos ||
         m.starts_with("ERR Error running script");
}

}  // namespace weir::admission
