#include "gateway/redis_key_scopes.hpp"

#include <chrono>

#include <fmt/format.h>
#include <boost/json/parse.hpp>

#include "gateway/key_store.hpp"

namespace weir::gateway {

namespace {

// One field's JSON, parsed by the admin API's rules; "" or "null": none.
template <class T, class Parse>
std::string parse_field(std::string_view text, std::string_view name, Parse parse, T& out) {
  if (text.empty()) return {};
  boost::system::error_code ec;
  const auto v = boost::json::parse(text, ec);
  if (ec) return fmt::format("{} is not JSON", name);
  auto r = parse(v, std::string(name));
  if (!r) return fmt::format("{}: {}", name, r.error().message);
  out = *r;
  return {};
}

}  // namespace

RedisKeyScopes::RedisKeyScopes(admission::Limiter& limiter, std::function<std::int32_t()> utc_offset_s)
    : limiter_(limiter), utc_offset_s_(std::move(utc_offset_s)) {}

std::string RedisKeyScopes::resolve(auth::RedisKeyRecord& rec, std::string_view limits, std::string_view budget) {
  auth::Limits l;
  auth::Budget b;
  if (auto why = parse_field(limits, "limits", parse_limits_json, l); !why.empty()) return why;
  if (auto why = parse_field(budget, "budget", parse_budget_json, b); !why.empty()) return why;
  if (b.calendar != core::CalendarPeriod::none && utc_offset_s_) b.utc_offset_s = utc_offset_s_();
  if (!l.any() && !b.any()) return {};  // the tenant's scope governs
  auto it = by_id_.find(rec.id);
  if (it == by_id_.end() || it->second.limits != l || it->second.budget != b) {
    const auto scope = limiter_.add_scope(auth::ScopeInfo{"key:" + rec.id, l, b});
    if (!scope)
      return fmt::format("the limiter holds at most {} admission scopes; restart to renumber them",
                         limiter_.scope_count());
    if (it != by_id_.end())
      limiter_.carry(it->second.scope, *scope, std::chrono::steady_clock::now());
    else
      it = by_id_.emplace(rec.id, Entry{}).first;
    it->second = Entry{*scope, l, b};
  }
  rec.own_scope = true;
  rec.scope = it->second.scope;
  rec.limits = l;
  rec.budget = b;
  return {};
}

std::optional<std::uint32_t> RedisKeyScopes::scope_of(std::string_view id) const {
  const auto it = by_id_.find(std::string(id));
  if (it == by_id_.end()) return std::nullopt;
  return it->second.scope;
}

}  // namespace weir::gateway
