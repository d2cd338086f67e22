#include "gateway/key_store.hpp"

#include "core/replace_file.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <openssl/rand.h>
#include <boost/json/parse.hpp>

#include "auth/crypto.hpp"
#include "core/note.hpp"
#include "core/yaml.hpp"

namespace weir::gateway {

namespace json = boost::json;

namespace {

constexpr std::size_t kMaxName = 256;

AdminError internal(std::string message) { return AdminError{500, "server_error", {}, std::move(message), {}}; }

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(raw.size())) != 1)
    throw std::runtime_error("RAND_bytes failed");
  return auth::to_hex(raw);
}

// A tenant a key may name: configured, not the implicit anonymous one
// (auth::TenantConfig::implicit), which serves only requests without credentials.
bool configured_tenant(const auth::AuthConfig& base, const std::string& name) {
  const auto t = base.tenants.find(name);
  return t != base.tenants.end() && !t->second.implicit;
}

AdminResult<std::string> parse_name(const json::value& v) {
  if (v.is_null()) return std::string();
  if (!v.is_string() || v.get_string().size() > kMaxName)
    return tl::unexpected(
        admin_bad_request(fmt::format("name must be a string of at most {} bytes", kMaxName), "name"));
  // As the configuration's names: a control character (\u0000, \u001b) is refused, not stored and shown.
  if (auto why = core::name_text_error(v.get_string()); !why.empty())
    return tl::unexpected(admin_bad_request("name: " + why, "name"));
  return std::string(v.get_string());
}

// The keys as the auth policy takes them (their admission scopes kept).
std::vector<auth::RuntimeKey> runtime_keys(const std::vector<KeyRecord>& keys) {
  std::vector<auth::RuntimeKey> rk;
  rk.reserve(keys.size());
  for (const auto& k : keys) {
    auth::ApiKeyConfig c;
    c.id = k.id;
    c.sha256 = k.sha256;
    c.tenant = k.tenant;
    c.models = k.models;
    c.limits = k.limits;
    c.budget = k.budget;
    c.expires_at = k.expires_at;
    rk.push_back({std::move(c), k.scope});
  }
  return rk;
}

}  // namespace

// ---------------------------------------------------------------- KeyStore

KeyStore::KeyStore(auth::AuthConfig base, std::string keys_file) : base_(std::move(base)), file_(std::move(keys_file)) {
  next_scope_ = auth::AuthPolicy::config_scopes(base_);
  policy_ = auth::AuthPolicy::build(base_, {}, next_scope_);
}

tl::expected<void, std::string> KeyStore::load() {
  if (file_.empty()) return {};
  std::error_code exists_ec;
  if (!std::filesystem::exists(file_, exists_ec) && !exists_ec) return {};  // no keys yet
  std::ifstream in(file_, std::ios::binary);
  if (!in) return tl::unexpected(fmt::format("admin.keys_file {}: {}", file_, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  boost::system::error_code ec;
  // Deeper than Boost.JSON's default (32): metadata up to kMaxMetadataDepth
  // sits three levels in (and files written before that limit, up to 30).
  json::parse_options deep;
  deep.max_depth = 64;
  json::value v = json::parse(ss.str(), ec, {}, deep);
  if (ec || !v.is_object() || !v.get_object().contains("keys") || !v.at("keys").is_array())
    return tl::unexpected(
        fmt::format("admin.keys_file {}: not a Weir keys file ({{\"version\":1,\"keys\":[...]}})", file_));
  if (const auto* ver = v.get_object().if_contains("version"); !ver || !ver->is_int64() || ver->get_int64() != 1)
    return tl::unexpected(fmt::format("admin.keys_file {}: version: expected 1 (the format this Weir writes)", file_));
  std::vector<KeyRecord> keys;
  std::unordered_map<std::string, std::size_t> ids;
  std::map<auth::Sha256Digest, std::size_t> secrets;
  std::size_t i = 0;
  for (const auto& e : v.at("keys").get_array()) {
    if (!e.is_object()) return tl::unexpected(fmt::format("admin.keys_file {}: keys[{}] is not an object", file_, i));
    auto k = key_from_file_json(e.get_object());
    if (!k)
      return tl::unexpected(fmt::format("admin.keys_file {}: keys[{}]: {}{}", file_, i,
                                        k.error().param.empty() ? "" : k.error().param + ": ", k.error().message));
    for (const auto& c : base_.api_keys) {
      if (c.id == k->id)
        return tl::unexpected(fmt::format(
            "admin.keys_file {}: keys[{}]: id '{}' is also a configured key's (auth.api_keys): ids must be unique",
            file_, i, k->id));
      if (c.sha256 == k->sha256)
        return tl::unexpected(
            fmt::format("admin.keys_file {}: keys[{}]: its secret is also the secret of configured key '{}' "
                        "(auth.api_keys): a secret "
                        "names one key",
                        file_, i, c.id));
    }
    // Each id and each secret once (as auth.api_keys): a second would be
    // unreachable, and a change to one id rewrote every record of it.
    if (const auto [it, fresh] = ids.emplace(k->id, i); !fresh)
      return tl::unexpected(
          fmt::format("admin.keys_file {}: keys[{}]: duplicate id '{}' (keys[{}])", file_, i, k->id, it->second));
    if (const auto [it, fresh] = secrets.emplace(k->sha256, i); !fresh)
      return tl::unexpected(
          fmt::format("admin.keys_file {}: keys[{}]: the same secret as keys[{}]", file_, i, it->second));
    if (!configured_tenant(base_, k->tenant))
      weir::core::note(
          "weir: admin.keys_file {}: key {} names tenant '{}', which is not configured: the key is "
          "kept and refused until the tenant is back\n",
          file_, k->id, k->tenant);
    k->scope = next_scope_++;
    keys.push_back(std::move(*k));
    ++i;
  }
  keys_ = std::move(keys);
  policy_ = auth::AuthPolicy::build(base_, runtime_keys(keys_), next_scope_);
  return {};
}

std::uint32_t KeyStore::free_scope() const noexcept {
  // Keys in Redis take scopes from the limiter at run time, past this store's.
  return limiter_ ? std::max(next_scope_, limiter_->scope_count()) : next_scope_;
}

std::uint32_t KeyStore::fresh_scope() {
  if (limiter_)
    if (const auto reusable = limiter_->reusable_scopes(); !reusable.empty()) return reusable.front();
  next_scope_ = free_scope();
  return next_scope_++;
}

auth::ScopeNumbers KeyStore::scope_numbers() const {
  return auth::ScopeNumbers(free_scope(), limiter_ ? limiter_->reusable_scopes() : std::vector<std::uint32_t>{});
}

std::shared_ptr<const auth::AuthPolicy> KeyStore::rebased_policy(const auth::AuthConfig& base) const {
  return auth::AuthPolicy::build(base, runtime_keys(keys_), scope_numbers(), policy_.get());
}

void KeyStore::rebase(auth::AuthConfig base, std::shared_ptr<const auth::AuthPolicy> policy) {
  base_ = std::move(base);
  policy_ = std::move(policy);
  next_scope_ = std::max(next_scope_, static_cast<std::uint32_t>(policy_->scopes().size()));
  for (const auto& k : keys_)
    if (!configured_tenant(base_, k.tenant))
      weir::core::note(
          "weir: runtime key {} names tenant '{}', which the reloaded configuration does not have: the key is "
          "kept and refused until the tenant is back\n",
          k.id, k.tenant);
}

const KeyRecord* KeyStore::find(std::string_view id) const {
  for (const auto& k : keys_)
    if (k.id == id) return &k;
  return nullptr;
}

bool KeyStore::id_taken(std::string_view id) const {
  if (find(id)) return true;
  for (const auto& k : base_.api_keys)
    if (k.id == id) return true;
  return false;
}

tl::expected<void, std::string> KeyStore::save(const std::vector<KeyRecord>& keys) const {
  if (file_.empty()) return {};
  json::array a;
  for (const auto& k : keys) a.emplace_back(key_file_json(k));
  json::object root;
  root["version"] = 1;
  root["keys"] = std::move(a);
  const std::string text = admin_json_text(root) + "\n";
  return core::replace_file(file_, text, 0600);
}

AdminResult<void> KeyStore::commit(std::vector<KeyRecord> next,
                                   std::optional<std::pair<std::uint32_t, std::uint32_t>> carry) {
  // With the running policy as the prior one: tenants and configured keys
  // keep the scopes they have (a reload may have numbered them apart from
  // name order), and so their buckets, slots and spend.
  auto policy = auth::AuthPolicy::build(base_, runtime_keys(next), scope_numbers(), policy_.get());
  // State for the new scopes first (unused until the policy is published),
  // and the policy's hold on them; a limiter that is full refuses the
  // change, which would otherwise index past it. (A change that then
  // fails to save drops the policy, and with it its hold.)
  if (limiter_) {
    policy = limiter_->adopt(std::move(policy));
    if (!policy)
      return tl::unexpected(internal(fmt::format(
          "The key was not changed: the limiter holds at most {} admission scopes at once.", limiter_->scope_count())));
  }
  if (auto ok = save(next); !ok) return tl::unexpected(internal("The key was not changed: " + ok.error()));
  // While the running policy, which names the old scope, still holds it: the
  // new scope is then held for the old one's tickets (ScopeLedger::pin).
  if (carry && limiter_) limiter_->carry_spend(carry->first, carry->second, std::chrono::steady_clock::now());
  keys_ = std::move(next);
  policy_ = std::move(policy);
  return {};
}

AdminResult<KeyStore::Change> KeyStore::create(const boost::json::object& body, std::int64_t now_s) {
  static constexpr std::string_view kFields[] = {"tenant",     "models",   "limits", "budget",
                                                 "expires_at", "metadata", "name"};
  for (const auto& [k, v] : body) {
    bool known = false;
    for (auto f : kFields) known = known || std::string_view(k) == f;
    if (!known)
      return tl::unexpected(admin_bad_request(fmt::format("unknown field '{}'", std::string_view(k).substr(0, 64)),
                                              std::string(std::string_view(k).substr(0, 64))));
  }
  const json::value null_value;
  auto field = [&](std::string_view f) -> const json::value& {
    const auto* v = body.if_contains(f);
    return v ? *v : null_value;
  };
  KeyRecord k;
  const auto& tenant = field("tenant");
  if (!tenant.is_string() || tenant.get_string().empty())
    return tl::unexpected(admin_bad_request("tenant is required: the name of a configured tenant", "tenant"));
  k.tenant = std::string(tenant.get_string());
  if (!configured_tenant(base_, k.tenant))
    return tl::unexpected(AdminError{404, "invalid_request_error", "tenant_not_found",
                                     fmt::format("No tenant named `{}` is configured.", k.tenant.substr(0, 128)),
                                     "tenant"});
  if (auto ok = read_key_settings(field, k); !ok) return tl::unexpected(ok.error());
  auto name = parse_name(field("name"));
  if (!name) return tl::unexpected(name.error());
  k.name = std::move(*name);
  do k.id = "vk_" + random_hex(8);
  while (id_taken(k.id));
  std::string secret = generate_key_secret();
  k.sha256 = auth::sha256(secret);
  k.created_at = now_s;
  k.scope = fresh_scope();
  auto next = keys_;
  next.push_back(k);
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  return Change{std::move(k), std::move(secret)};
}

AdminResult<KeyStore::Change> KeyStore::update(std::string_view id, const boost::json::object& body) {
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord k = *cur;
  bool rescope = false;
  for (const auto& [f, v] : body) {
    if (f == "models") {
      auto m = parse_models(v);
      if (!m) return tl::unexpected(m.error());
      k.models = std::move(*m);
    } else if (f == "limits") {
      auto l = parse_limits_json(v, "limits");
      if (!l) return tl::unexpected(l.error());
      rescope = rescope || *l != k.limits;  // the same values again (an idempotent tool): nothing changes
      k.limits = *l;
    } else if (f == "budget") {
      auto b = parse_budget_json(v, "budget");
      if (!b) return tl::unexpected(b.error());
      rescope = rescope || *b != k.budget;
      k.budget = *b;
    } else if (f == "expires_at") {
      auto e = parse_expiry_json(v, "expires_at");
      if (!e) return tl::unexpected(e.error());
      k.expires_at = *e;
    } else if (f == "metadata") {
      auto m = parse_metadata(v);
      if (!m) return tl::unexpected(m.error());
      k.metadata = std::move(*m);
    } else if (f == "name") {
      auto n = parse_name(v);
      if (!n) return tl::unexpected(n.error());
      k.name = std::move(*n);
    } else {
      const std::string_view name(f);
      const bool fixed = name == "tenant" || name == "id" || name == "key" || name == "created_at";
      return tl::unexpected(
          admin_bad_request(fixed ? fmt::format("'{}' cannot be changed (create a new key instead)", name)
                                  : fmt::format("unknown field '{}'", name.substr(0, 64)),
                            std::string(name.substr(0, 64))));
    }
  }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> carry;
  if (rescope) {  // fresh buckets at the new limits; the spend and the streams in flight carry over (commit)
    carry.emplace(k.scope, fresh_scope());
    k.scope = carry->second;
  }
  auto next = keys_;
  for (auto& e : next)
    if (e.id == k.id) e = k;
  if (auto ok = commit(std::move(next), carry); !ok) return tl::unexpected(ok.error());
  return Change{std::move(k), {}};
}

AdminResult<KeyRecord> KeyStore::revoke(std::string_view id) {
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord gone = *cur;
  std::vector<KeyRecord> next;
  for (const auto& e : keys_)
    if (e.id != id) next.push_back(e);
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  return gone;
}

AdminResult<KeyStore::Change> KeyStore::rotate(std::string_view id) {
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord k = *cur;
  std::string secret = generate_key_secret();
  k.sha256 = auth::sha256(secret);
  auto next = keys_;
  for (auto& e : next)
    if (e.id == k.id) e = k;
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  return Change{std::move(k), std::move(secret)};
}

}  // namespace weir::gateway
