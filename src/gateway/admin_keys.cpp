// The admin API's keys and tenants (docs/admin-api.md): GET|POST
// /admin/v1/keys, GET|PATCH|DELETE /admin/v1/keys/{id}, POST .../rotate,
// GET /admin/v1/tenants[/{name}], with each scope's admission state.
#include <boost/json/serialize.hpp>

#include "core/calendar.hpp"
#include "core/json_text.hpp"
#include "gateway/admin_handlers.hpp"
#include "gateway/admin_server.hpp"
#include "gateway/redis_key_admin.hpp"
#include "gateway/redis_key_scopes.hpp"

namespace weir::gateway {

namespace json = boost::json;
using namespace admin_detail;

// ---------------------------------------------------------------- usage

namespace {

// A runtime key as every answer shows it: key_json, writable, and whether
// it has expired (at Unix second `now`; expires_at is the first second it
// no longer works).
json::object runtime_key_json(const KeyRecord& k, std::int64_t now) {
  auto o = key_json(k);
  o["read_only"] = false;
  o["expired"] = k.expires_at != 0 && now >= k.expires_at;
  return o;
}

}  // namespace

json::object AdminServer::usage_json(std::uint32_t scope, const auth::Limits& l, const auth::Budget& b) const {
  json::object u;
  auto* lim = shared_.limiter;
  const bool held = lim && (lim->grows() ? scope < lim->scope_count() : scope < initial_scopes_);
  const auto now = std::chrono::steady_clock::now();
  u["requests"] = held && l.requests_per_minute ? bucket_json(lim->view(scope, admission::Bucket::requests, now))
                                                : json::value(nullptr);
  u["tokens"] = held && l.tokens_per_minute ? bucket_json(lim->view(scope, admission::Bucket::tokens, now))
                                            : json::value(nullptr);
  if (held && l.max_concurrent_streams) {
    json::object s;
    s["limit"] = l.max_concurrent_streams;
    s["in_flight"] = lim->streams_in_use(scope);
    u["streams"] = std::move(s);
  } else {
    u["streams"] = nullptr;
  }
  if (held && b.any()) {
    const std::int64_t spent = lim->spent(scope, now);
    json::object s;
    s["limit_usd"] = static_cast<double>(b.limit_nano_usd) / 1e9;
    s["spent_usd"] = static_cast<double>(spent) / 1e9;
    s["remaining_usd"] = static_cast<double>(b.limit_nano_usd - spent) / 1e9;
    s["period"] = budget_json(b).as_object().at("period");
    // The current window, RFC 3339 UTC; null when the budget never resets.
    const auto w = lim->budget_window(scope, b, now);
    s["window_start"] = b.resets() ? json::value(core::format_rfc3339_utc(w.start_ns)) : json::value(nullptr);
    s["window_end"] = b.resets() ? json::value(core::format_rfc3339_utc(w.end_ns)) : json::value(nullptr);
    u["budget"] = std::move(s);
  } else {
    u["budget"] = nullptr;
  }
  return u;
}

core::Task<AdminResult<std::unordered_map<std::string, std::size_t>>> AdminServer::runtime_keys_by_tenant() {
  std::unordered_map<std::string, std::size_t> n;
  if (!keys_) co_return n;
  if (redis_) {  // (keys in Redis are no local store's: the list_keys view of them)
    auto all = co_await redis_->list();
    if (!all) co_return tl::unexpected(all.error());
    for (const auto& k : *all) ++n[k.tenant];
  } else {
    for (const auto& k : keys_->keys()) ++n[k.tenant];
  }
  co_return n;
}

json::object AdminServer::tenant_json(
    const auth::TenantPolicy& t, const AdminResult<std::unordered_map<std::string, std::size_t>>& runtime_keys) const {
  json::object o;
  o["object"] = "tenant";
  o["name"] = t.name;
  const auto& cfg = shared_.auth_policy->config().tenants;
  json::array models;
  if (auto it = cfg.find(t.name); it != cfg.end())
    for (const auto& m : it->second.models) models.emplace_back(m);
  o["models"] = std::move(models);
  o["priority"] = t.priority;
  o["tier"] = t.tier;
  o["limits"] = limits_json(t.limits);
  o["budget"] = budget_json(t.budget);
  o["usage"] = usage_json(t.scope, t.limits, t.budget);
  if (runtime_keys) {
    const auto it = runtime_keys->find(t.name);
    o["runtime_keys"] = it == runtime_keys->end() ? 0 : it->second;
  } else {
    // The rest is this replica's own state and needs no Redis: the count alone is unknown.
    o["runtime_keys"] = nullptr;
    o["runtime_keys_error"] = runtime_keys.error().message;
  }
  // The anonymous tenant Weir made (tenants: does not list it): it serves requests without credentials, and no
  // key can name it (create_key's 404), so the console offers it for none.
  o["implicit"] = t.implicit;
  return o;
}

json::object AdminServer::config_key_json(const auth::KeyPolicy& k) const {
  json::object o;
  o["object"] = "key";
  o["id"] = k.id;
  o["name"] = nullptr;
  o["tenant"] = k.tenant->name;
  o["models"] = nullptr;
  for (const auto& c : shared_.auth_policy->config().api_keys)
    if (c.id == k.id && c.models) {
      json::array a;
      for (const auto& m : *c.models) a.emplace_back(m);
      o["models"] = std::move(a);
    }
  o["limits"] = limits_json(k.limits);
  o["budget"] = budget_json(k.budget);
  o["expires_at"] = nullptr;
  o["metadata"] = json::object{};
  o["created_at"] = nullptr;
  o["source"] = "config";
  o["read_only"] = true;
  return o;
}

// ---------------------------------------------------------------- handlers

core::Task<AdminResponse> AdminServer::list_keys(AdminRequest&) {
  json::array data;
  if (keys_) {
    for (const auto& k : keys_->policy()->keys())
      if (!k.runtime) data.emplace_back(config_key_json(k));
    const auto now = unix_now();
    std::vector<KeyRecord> from_redis;
    if (redis_) {
      auto all = co_await redis_->list();
      if (!all) co_return error_response(all.error());
      from_redis = std::move(*all);
    }
    for (const auto& k : redis_ ? from_redis : keys_->keys()) {
      auto o = runtime_key_json(k, now);
      data.emplace_back(std::move(o));
    }
  }
  json::object o;
  o["object"] = "list";
  o["data"] = std::move(data);
  o["persistence"] = !keys_ ? "none" : redis_ ? "redis" : keys_->persistent() ? "keys_file" : "memory";
  co_return json_response(200, o);
}

core::Task<AdminResponse> AdminServer::create_key(AdminRequest& r) {
  if (!keys_) co_return error_response(no_keys());
  auto body = parse_object(r.body);
  if (!body) co_return error_response(body.error());
  AdminResult<KeyStore::Change> c;
  std::size_t pending = 0;  // workers the new key had not reached in time
  if (redis_) {
    c = co_await redis_->create(std::move(*body), unix_now());
  } else {
    const auto version = keys_->version();
    c = keys_->create(*body, unix_now());
    // (Also when the change failed after reading the file again: another process's changes are in force here.)
    if (keys_->version() != version) pending = co_await publish(keys_->policy());
  }
  if (!c) co_return error_response(c.error());
  // (`expired` too: an expires_at already past makes a key that works nowhere.)
  auto o = runtime_key_json(c->record, unix_now());
  o["key"] = c->secret;  // the only time the secret is shown
  co_return applied_response(201, o, pending);
}

core::Task<AdminResponse> AdminServer::get_key(AdminRequest& r) {
  if (!keys_) co_return error_response(no_keys());
  const std::string id = r.params.at(0);
  if (redis_ && !is_config_key(*keys_, id)) {
    auto k = co_await redis_->get(id);
    if (!k) co_return error_response(k.error());
    auto o = runtime_key_json(*k, unix_now());
    // Its admission state as this replica holds it, once a request here looked it up.
    if (k->limits.any() || k->budget.any())
      if (auto scope = shared_.redis_key_scopes ? shared_.redis_key_scopes->scope_of(id) : std::nullopt)
        o["usage"] = usage_json(*scope, k->limits, k->budget);
    co_return json_response(200, o);
  }
  if (const KeyRecord* k = keys_->find(id)) {
    auto o = runtime_key_json(*k, unix_now());
    o["usage"] = usage_json(k->scope, k->limits, k->budget);
    co_return json_response(200, o);
  }
  for (const auto& k : keys_->policy()->keys())
    if (!k.runtime && k.id == id) {
      auto o = config_key_json(k);
      o["usage"] = usage_json(k.scope, k.limits, k.budget);
      co_return json_response(200, o);
    }
  co_return error_response(admin_not_found(fmt::format("No key with id `{}`.", id.substr(0, 128))));
}

core::Task<AdminResponse> AdminServer::update_key(AdminRequest& r) {
  if (!keys_) co_return error_response(no_keys());
  const std::string id = r.params.at(0);
  if (is_config_key(*keys_, id)) co_return error_response(read_only(id));
  auto body = parse_object(r.body);
  if (!body) co_return error_response(body.error());
  AdminResult<KeyStore::Change> c;
  std::size_t pending = 0;
  if (redis_) {
    c = co_await redis_->update(id, std::move(*body));
    if (c) pending = co_await forget_redis_keys();
  } else {
    const auto version = keys_->version();
    c = keys_->update(id, *body);
    if (keys_->version() != version) pending = co_await publish(keys_->policy());
  }
  if (!c) co_return error_response(c.error());
  auto o = runtime_key_json(c->record, unix_now());
  co_return applied_response(200, o, pending);
}

core::Task<AdminResponse> AdminServer::delete_key(AdminRequest& r) {
  if (!keys_) co_return error_response(no_keys());
  const std::string id = r.params.at(0);
  if (is_config_key(*keys_, id)) co_return error_response(read_only(id));
  AdminResult<KeyRecord> gone;
  std::size_t pending = 0;
  if (redis_) {
    gone = co_await redis_->revoke(id);
    if (gone) pending = co_await forget_redis_keys();
  } else {
    const auto version = keys_->version();
    gone = keys_->revoke(id);
    if (keys_->version() != version) pending = co_await publish(keys_->policy());
  }
  if (!gone) co_return error_response(gone.error());
  json::object o;
  o["object"] = "key";
  o["id"] = gone->id;
  o["deleted"] = true;
  co_return applied_response(200, o, pending);
}

core::Task<AdminResponse> AdminServer::rotate_key(AdminRequest& r) {
  if (!keys_) co_return error_response(no_keys());
  const std::string id = r.params.at(0);
  if (is_config_key(*keys_, id)) co_return error_response(read_only(id));
  // Rotate takes no parameters: an empty body or {}; a field is refused (the route's unread_body_error) rather
  // than ignored, so a client expecting, say, a grace period learns that the old secret stops at once.
  AdminResult<KeyStore::Change> c;
  std::size_t pending = 0;
  if (redis_) {
    c = co_await redis_->rotate(id);
    if (c) pending = co_await forget_redis_keys();
  } else {
    const auto version = keys_->version();
    c = keys_->rotate(id);
    if (keys_->version() != version) pending = co_await publish(keys_->policy());
  }
  if (!c) co_return error_response(c.error());
  auto o = runtime_key_json(c->record, unix_now());
  o["key"] = c->secret;
  co_return applied_response(200, o, pending);
}

core::Task<AdminResponse> AdminServer::list_tenants(AdminRequest&) {
  json::array data;
  const auto counts = co_await runtime_keys_by_tenant();
  if (shared_.auth_policy)
    for (const auto& t : shared_.auth_policy->tenants()) data.emplace_back(tenant_json(t, counts));
  json::object o;
  o["object"] = "list";
  o["data"] = std::move(data);
  co_return json_response(200, o);
}

core::Task<AdminResponse> AdminServer::get_tenant(AdminRequest& r) {
  const std::string& name = r.params.at(0);
  const auth::TenantPolicy* t = shared_.auth_policy ? shared_.auth_policy->find_tenant(name) : nullptr;
  if (!t) co_return error_response(admin_not_found(fmt::format("No tenant named `{}`.", name.substr(0, 128))));
  const auto counts = co_await runtime_keys_by_tenant();
  co_return json_response(200, tenant_json(*t, counts));
}

}  // namespace weir::gateway
