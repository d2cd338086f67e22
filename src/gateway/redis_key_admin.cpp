#include "gateway/redis_key_admin.hpp"

#include <algorithm>

#include <span>

#include <fmt/format.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace weir::gateway {

namespace json = boost::json;

namespace {

// The fields the admin reads and writes (the lookup path reads the first six and the last two).
constexpr std::string_view kFields[] = {"id",   "tenant",   "models",     "tier",   "revoked", "expires_at",
                                        "name", "metadata", "created_at", "limits", "budget"};

// A write (create, PATCH, DELETE, rotate) that failed, said as what is known of its outcome:
//  - never sent (no connection): nothing was changed;
//  - Redis answered with an error (OOM, READONLY, NOPERM...): it refused the change, nothing was changed;
//  - sent, then no reply in time or the connection lost: Redis may have applied it (late): unknown.
AdminError unavailable(const store::Error& e) {
  std::string msg;
  if (e.code == store::Errc::server)
    msg = fmt::format("The Redis key store refused the change ({}); nothing was changed.", e.message);
  else if (e.not_sent())
    msg = fmt::format("The Redis key store did not answer ({}); nothing was changed.", e.message);
  else
    msg = fmt::format(
        "The Redis key store did not answer in time ({}): the change was sent and may still be applied; "
        "list or get the key before trying again.",
        e.message);
  return AdminError{503, "server_error", "key_store_unavailable", std::move(msg), {}};
}

// The same for a read (a list): it changes nothing in any case.
AdminError unavailable_read(const store::Error& e) {
  AdminError a = unavailable(e);
  a.message = e.code == store::Errc::server ? fmt::format("The Redis key store answered with an error ({}).", e.message)
                                            : fmt::format("The Redis key store did not answer ({}).", e.message);
  return a;
}

AdminError not_found(std::string_view id) {
  return admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128)));
}

// Writes or revokes a record only while it is live (there, and not revoked:
// a hand-made record may lack the field), in one step: an admin change read
// before a concurrent DELETE or rotate must not bring the revoked secret
// back by rewriting its record. KEYS[1] the record; ARGV field/value pairs
// (none: revoke). Returns 1 when done, 0 when the record was no longer live.
const store::Script& live_write_script() {
  static const store::Script s(R"lua(
local r = redis.call('HGET', KEYS[1], 'revoked')
if redis.call('EXISTS', KEYS[1]) == 0 or (r and r ~= '0' and r ~= '') then return 0 end
if #ARGV == 0 then redis.call('HSET', KEYS[1], 'revoked', '1') else redis.call('HSET', KEYS[1], unpack(ARGV)) end
return 1
)lua");
  return s;
}

// Rotates a record in one step: copies every field of the live record
// KEYS[1] to the new secret's record KEYS[2] (live) and revokes KEYS[1], so
// a PATCH that lands on the old record either comes first (and is copied)
// or finds it revoked (404), never lost. Returns 1 when done, 0 when KEYS[1]
// was no longer live. (One Redis: the two keys need not share a slot.)
const store::Script& rotate_script() {
  static const store::Script s(R"lua(
local r = redis.call('HGET', KEYS[1], 'revoked')
if redis.call('EXISTS', KEYS[1]) == 0 or (r and r ~= '0' and r ~= '') then return 0 end
local all = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], unpack(all))
redis.call('HSET', KEYS[2], 'revoked', '0')
redis.call('HSET', KEYS[1], 'revoked', '1')
return 1
)lua");
  return s;
}

std::string join_models(const std::optional<std::vector<std::string>>& m) {
  std::string out;
  if (!m) return out;
  for (const auto& s : *m) out += (out.empty() ? "" : ",") + s;
  return out;
}

// A record from HMGET's values (kFields order), or nullopt for revoked or invalid ones.
std::optional<KeyRecord> from_fields(const std::string& redis_key, const store::Reply& a) {
  if (a.type != store::Reply::Type::array || a.elements.size() != std::size(kFields)) return std::nullopt;
  auto v = [&](std::size_t i) -> const std::string& { return a.elements[i].str; };
  if (v(0).empty() || v(1).empty() || (!v(4).empty() && v(4) != "0")) return std::nullopt;
  KeyRecord k;
  auto hex = std::string_view(redis_key).substr(redis_key.size() - 64);
  auto d = auth::parse_sha256_hex(hex);
  if (!d) return std::nullopt;
  k.sha256 = *d;
  k.id = v(0);
  k.tenant = v(1);
  // The list as the lookup reads it (auth::split_key_models): "a, b" is a and b, "," no list (the tenant's).
  // A field over the lookup's limit makes a record every lookup refuses: not listed, as one whose limits do
  // not read (below).
  for (const std::size_t i : {0, 1, 2, 3, 4, 5, 9, 10})  // the fields the lookup reads
    if (v(i).size() > auth::kMaxKeyRecordField) return std::nullopt;
  if (auto models = auth::split_key_models(v(2)); !models.empty()) k.models = std::move(models);
  // expires_at as the request path reads it (auth/redis_keys.cpp): Unix
  // seconds, empty for never; "0" is a time (1970: expired), never "never";
  // anything else makes the record one every lookup refuses.
  if (!v(5).empty() && (v(5).find_first_not_of("0123456789") != std::string_view::npos || v(5).size() > 18))
    return std::nullopt;
  k.expires_at = v(5).empty() ? 0 : std::max<std::int64_t>(a.elements[5].as_int(0), 1);
  k.name = v(6);
  if (!v(7).empty()) {
    boost::system::error_code ec;
    auto md = json::parse(v(7), ec);
    if (!ec && md.is_object()) k.metadata = std::move(md.get_object());
  }
  k.created_at = a.elements[8].as_int(0);
  // Limits and budget as the admin wrote them. A record whose fields do not
  // read (written by hand) is refused by every lookup: it is not listed,
  // found or changed here either, so a PATCH cannot rewrite it into a key
  // without its limits. Fix such a record in Redis.
  boost::system::error_code ec;
  if (!v(9).empty()) {
    auto l = json::parse(v(9), ec);
    auto p = ec ? AdminResult<auth::Limits>(tl::unexpected(AdminError{})) : parse_limits_json(l, "limits");
    if (!p) return std::nullopt;
    k.limits = *p;
  }
  if (!v(10).empty()) {
    auto b = json::parse(v(10), ec);
    auto p = ec ? AdminResult<auth::Budget>(tl::unexpected(AdminError{})) : parse_budget_json(b, "budget");
    if (!p) return std::nullopt;
    k.budget = *p;
  }
  if (!v(5).empty() && v(5).find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return k;
}

}  // namespace

RedisKeyAdmin::RedisKeyAdmin(auth::RedisKeys& keys, std::shared_ptr<const auth::AuthPolicy> base)
    : keys_(keys), base_(std::move(base)) {}

core::Task<AdminResult<bool>> RedisKeyAdmin::write(const KeyRecord& k, bool only_live, const json::object* fields) {
  const std::string key = auth::RedisKeys::redis_key(keys_.key_prefix(), k.sha256);
  std::vector<std::string> args;
  auto add = [&](std::string_view f, std::string v) {
    // A PATCH writes the fields it changed only: two PATCHes of one key at
    // once (one its limits, one its metadata) must both hold, as in memory.
    if (fields && !fields->contains(f)) return;
    args.emplace_back(f);
    args.push_back(std::move(v));
  };
  add("id", k.id);
  add("tenant", k.tenant);
  add("models", join_models(k.models));
  add("revoked", "0");
  add("expires_at", k.expires_at ? std::to_string(k.expires_at) : std::string());
  add("name", k.name);
  add("metadata", admin_json_text(k.metadata));
  add("created_at", std::to_string(k.created_at));
  // Empty when the key has none: its tenant's limits and budget govern it alone.
  add("limits", k.limits.any() ? admin_json_text(limits_json(k.limits)) : std::string());
  add("budget", k.budget.any() ? admin_json_text(budget_json(k.budget)) : std::string());
  if (fields && args.empty()) co_return true;  // nothing changed (an empty script call would revoke)
  if (!only_live) {
    args.insert(args.begin(), {std::string("HSET"), key});
    auto r = co_await keys_.client().exec(store::Command(std::span<const std::string>(args)));
    if (!r) co_return tl::unexpected(unavailable(r.error()));
    co_return true;
  }
  const std::string keys[] = {key};
  auto r = co_await keys_.client().exec(store::Command::evalsha(live_write_script(), keys, args));
  if (!r) co_return tl::unexpected(unavailable(r.error()));
  co_return r->as_int(0) == 1;
}

core::Task<AdminResult<bool>> RedisKeyAdmin::set_revoked(const KeyRecord& k) {
  const std::string keys[] = {auth::RedisKeys::redis_key(keys_.key_prefix(), k.sha256)};
  auto r = co_await keys_.client().exec(store::Command::evalsha(live_write_script(), keys, {}));
  if (!r) co_return tl::unexpected(unavailable(r.error()));
  co_return r->as_int(0) == 1;
}

core::Task<AdminResult<std::vector<KeyRecord>>> RedisKeyAdmin::list() {
  std::vector<KeyRecord> out;
  // The prefix is text, not a pattern: "app?:" must not list (and revoke) "apps:"'s keys, nor "a[1]:" miss its own.
  const std::string own = keys_.key_prefix() + "key:";
  const std::string pattern = store::glob_literal(own) + "*";
  std::string cursor = "0";
  do {
    auto r = co_await keys_.client().exec(store::Command{"SCAN", cursor, "MATCH", pattern, "COUNT", "500"});
    if (!r) co_return tl::unexpected(unavailable_read(r.error()));
    if (r->type != store::Reply::Type::array || r->elements.size() != 2)
      co_return tl::unexpected(AdminError{500, "server_error", {}, "Unexpected SCAN reply from Redis.", {}});
    cursor = r->elements[0].str;
    std::vector<store::Command> gets;
    std::vector<std::string> names;
    for (const auto& n : r->elements[1].elements) {
      if (n.str.size() < 64 || !n.str.starts_with(own)) continue;
      std::vector<std::string_view> args = {"HMGET", n.str};
      for (auto f : kFields) args.push_back(f);
      gets.emplace_back(std::span<const std::string_view>(args));
      names.push_back(n.str);
    }
    if (gets.empty()) continue;
    auto replies = co_await keys_.client().exec(std::move(gets));
    for (std::size_t i = 0; i < replies.size() && i < names.size(); ++i) {
      if (!replies[i]) {
        if (replies[i].error().code == store::Errc::server) continue;  // not a hash
        co_return tl::unexpected(unavailable_read(replies[i].error()));
      }
      if (auto k = from_fields(names[i], *replies[i])) out.push_back(std::move(*k));
    }
  } while (cursor != "0");
  std::sort(out.begin(), out.end(), [](const KeyRecord& a, const KeyRecord& b) { return a.created_at < b.created_at; });
  co_return out;
}

core::Task<AdminResult<std::vector<KeyRecord>>> RedisKeyAdmin::records_of(std::string id) {
  auto all = co_await list();
  if (!all) co_return tl::unexpected(all.error());
  std::vector<KeyRecord> out;
  for (auto& k : *all)
    if (k.id == id) out.push_back(std::move(k));
  if (out.empty()) co_return tl::unexpected(not_found(id));
  co_return out;
}

core::Task<AdminResult<KeyRecord>> RedisKeyAdmin::get(std::string id) {
  auto all = co_await records_of(std::move(id));
  if (!all) co_return tl::unexpected(all.error());
  co_return std::move(all->front());
}

core::Task<AdminResult<KeyStore::Change>> RedisKeyAdmin::create(boost::json::object body, std::int64_t now_s) {
  // The in-memory store validates the body exactly as for local keys; its record is written to Redis.
  const auto base = base_;  // a reload may replace base_ while this waits on Redis
  KeyStore scratch(base->config(), "");
  auto c = scratch.create(body, now_s);
  if (!c) co_return tl::unexpected(c.error());
  if (auto ok = co_await write(c->record, false, nullptr); !ok) co_return tl::unexpected(ok.error());
  co_return std::move(*c);
}

core::Task<AdminResult<KeyStore::Change>> RedisKeyAdmin::update(std::string id, boost::json::object body) {
  const auto base = base_;  // a reload may replace base_ while this waits on Redis
  auto all = co_await records_of(id);
  if (!all) co_return tl::unexpected(all.error());
  const KeyRecord* cur = &all->front();
  // The change is validated and applied by a scratch store (the rules of local keys), then written.
  KeyStore scratch(base->config(), "");
  json::object seed;
  seed["tenant"] = cur->tenant;
  if (cur->models) seed["models"] = json::array(cur->models->begin(), cur->models->end());
  if (cur->expires_at) seed["expires_at"] = cur->expires_at;
  seed["metadata"] = cur->metadata;
  if (!cur->name.empty()) seed["name"] = cur->name;
  if (cur->limits.any()) seed["limits"] = limits_json(cur->limits);
  if (cur->budget.any()) seed["budget"] = budget_json(cur->budget);
  auto made = scratch.create(seed, cur->created_at);
  if (!made) co_return tl::unexpected(made.error());
  auto u = scratch.update(made->record.id, body);
  if (!u) co_return tl::unexpected(u.error());
  auto changed = [&](KeyRecord k) {
    k.models = u->record.models;
    k.expires_at = u->record.expires_at;
    k.metadata = u->record.metadata;
    k.name = u->record.name;
    k.limits = u->record.limits;
    k.budget = u->record.budget;
    return k;
  };
  // Every live record of the id (one key re-issued by hand under one id has
  // several) takes the change: a key's id names one key to the admin API.
  // A record revoked since it was read (a DELETE or a rotate meanwhile) is not written back: 404, as after.
  for (const KeyRecord& r : *all) {
    auto ok = co_await write(changed(r), true, &body);
    if (!ok) co_return tl::unexpected(ok.error());
    if (!*ok) co_return tl::unexpected(not_found(id));
  }
  co_return KeyStore::Change{changed(all->front()), {}};
}

core::Task<AdminResult<KeyRecord>> RedisKeyAdmin::revoke(std::string id) {
  // Every live record of the id: no key of that id works after the answer
  // (scripts/weir-key revoke --id does the same). A rotate beside it moves a
  // record to a new secret (one script: the new record live, the old one
  // revoked), so a pass that finds a record revoked under it scans the id
  // again, and a first scan that finds none scans once more: SCAN may miss a
  // record created while it ran. Done when a pass revokes only records that
  // were still live, or when none is left after one was revoked; a rotate
  // after that finds its record revoked (404).
  std::optional<KeyRecord> first;
  for (int pass = 0; pass < 8; ++pass) {
    auto all = co_await records_of(id);
    if (!all) {
      if (all.error().status != 404) co_return tl::unexpected(all.error());
      if (first) co_return std::move(*first);
      if (pass == 0) continue;
      co_return tl::unexpected(all.error());
    }
    if (!first) first = all->front();
    bool raced = false;
    for (const KeyRecord& k : *all) {
      auto ok = co_await set_revoked(k);
      if (!ok) co_return tl::unexpected(ok.error());
      raced = raced || !*ok;
    }
    if (!raced) co_return std::move(*first);
  }
  co_return tl::unexpected(AdminError{409,
                                      "invalid_request_error",
                                      "conflict",
                                      "The key kept being rotated while it was being revoked: try again.",
                                      {}});
}

core::Task<AdminResult<KeyStore::Change>> RedisKeyAdmin::rotate(std::string id) {
  auto all = co_await records_of(id);
  if (!all) co_return tl::unexpected(all.error());
  KeyRecord k = all->front();
  std::string secret = generate_key_secret();
  k.sha256 = auth::sha256(secret);
  const std::string keys[] = {auth::RedisKeys::redis_key(keys_.key_prefix(), all->front().sha256),
                              auth::RedisKeys::redis_key(keys_.key_prefix(), k.sha256)};
  auto moved = co_await keys_.client().exec(store::Command::evalsha(rotate_script(), keys, {}));
  if (!moved) co_return tl::unexpected(unavailable(moved.error()));
  if (moved->as_int(0) != 1) co_return tl::unexpected(not_found(id));  // revoked meanwhile (a DELETE, a rotate)
  // Every other earlier secret of the id stops working too. One revoked meanwhile (a DELETE, or another rotate
  // that got there first) makes this rotate lose: its new record goes, so the id never has two live secrets.
  for (const KeyRecord& old : std::span(*all).subspan(1)) {
    auto ok = co_await set_revoked(old);
    if (!ok || !*ok) {
      const std::string fresh = auth::RedisKeys::redis_key(keys_.key_prefix(), k.sha256);
      (void)co_await keys_.client().exec(store::Command{"DEL", fresh});
      co_return tl::unexpected(ok ? not_found(id) : ok.error());
    }
  }
  co_return KeyStore::Change{std::move(k), std::move(secret)};
}

}  // namespace weir::gateway
