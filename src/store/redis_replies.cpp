#include "store/redis_replies.hpp"

#include <fmt/format.h>

namespace weir::store {

namespace {
// `m` begins with the word `w` (an error's code: "READONLY You can't ...", or alone).
bool starts_with_word(std::string_view m, std::string_view w) noexcept {
  return m.starts_with(w) && (m.size() == w.size() || m[w.size()] == ' ');
}
}  // namespace

bool wrong_server_reply(std::string_view m) noexcept {
  // LOADING is not one: the server is about to serve (a restart reading its data, or a replica loading its
  // master's, which answers READONLY next). NOREPLICAS, OOM, MISCONF, BUSY are the right server's state.
  static constexpr std::string_view kWrong[] = {"READONLY", "MASTERDOWN", "MOVED", "ASK"};
  for (std::string_view w : kWrong) {
    if (starts_with_word(m, w)) return true;
    // Relayed by a script (Redis 6: "ERR Error running script (call to f_...): @user_script:9: @user_script: 9:
    // -READONLY You can't write against a read only replica.").
    if (!m.starts_with("ERR ")) continue;
    for (std::string_view sep : {": ", ": -"})
      for (std::size_t at = m.find(sep); at != std::string_view::npos; at = m.find(sep, at + 1)) {
        const std::string_view rest = m.substr(at + sep.size());
        if (starts_with_word(rest, w)) return true;
      }
  }
  return false;
}

bool refused_reply(std::string_view m) noexcept {
  // NOAUTH: Redis has `requirepass` (or an ACL default user with a password) and Weir sent none; every command
  // on the connection is refused, and Redis closes it at the next pipelined one ("unauthenticated multibulk
  // length"). WRONGPASS: AUTH refused later (relayed). "ERR max number of clients reached": sent unasked on
  // accept, then Redis closes.
  static constexpr std::string_view kRefused[] = {"NOAUTH", "WRONGPASS"};
  for (std::string_view w : kRefused)
    if (starts_with_word(m, w)) return true;
  return m.starts_with("ERR max number of clients reached");
}

std::string endpoint_text(std::string_view host, std::uint16_t port) {
  if (host.find(':') != std::string_view::npos && !host.starts_with('[')) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string first_sentence(std::string_view m) {
  if (const auto dot = m.find(". "); dot != std::string_view::npos) m = m.substr(0, dot);
  if (const auto nl = m.find_first_of("\r\n"); nl != std::string_view::npos) m = m.substr(0, nl);
  constexpr std::size_t kMax = 120;
  if (m.size() > kMax) return fmt::format("{}...", m.substr(0, kMax));
  return std::string(m);
}

}  // namespace weir::store
