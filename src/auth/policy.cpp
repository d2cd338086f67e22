#include "auth/policy.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

#include <openssl/crypto.h>

namespace weir::auth {

ModelList::ModelList(const std::vector<std::string>& patterns) {
  all_ = false;  // an empty list allows nothing; "*" allows everything
  for (const auto& p : patterns) {
    if (p == "*")
      all_ = true;
    else if (!p.empty() && p.back() == '*')
      prefixes_.push_back(p.substr(0, p.size() - 1));
    else
      exact_.push_back(p);
  }
}

bool ModelList::allows(std::string_view model) const noexcept {
  if (all_) return true;
  for (const auto& e : exact_)
    if (e == model) return true;
  for (const auto& p : prefixes_)
    if (model.substr(0, p.size()) == p) return true;
  return false;
}

std::size_t AuthPolicy::DigestHash::operator()(const Sha256Digest& d) const noexcept {
  std::size_t h;
  std::memcpy(&h, d.data(), sizeof h);  // SHA-256 output is uniform: any 8 bytes hash well
  return h;
}

bool AuthPolicy::DigestEq::operator()(const Sha256Digest& a, const Sha256Digest& b) const noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::shared_ptr<const AuthPolicy> AuthPolicy::build(AuthConfig config) { return build(std::move(config), {}, 0); }

std::uint32_t AuthPolicy::config_scopes(const AuthConfig& config) {
  const bool anon_listed = config.tenants.count(config.anonymous_tenant) > 0;
  return static_cast<std::uint32_t>(config.tenants.size() + (anon_listed ? 0 : 1) + config.api_keys.size());
}

std::shared_ptr<const AuthPolicy> AuthPolicy::build(AuthConfig config, const std::vector<RuntimeKey>& runtime,
                                                    ScopeNumbers numbers, const AuthPolicy* prior) {
  const std::uint32_t scope_count = numbers.end;
  std::shared_ptr<AuthPolicy> p(new AuthPolicy());
  p->config_ = std::move(config);
  auto& tenants = p->config_.tenants;
  if (!tenants.count(p->config_.anonymous_tenant)) {  // parse_auth_config adds it; hand-built configs may not
    TenantConfig anon;
    anon.name = p->config_.anonymous_tenant;
    tenants.emplace(anon.name, std::move(anon));
  }
  const auto& cfg = p->config_;
  // Scope numbers. Without a prior policy: tenants 0.., then the configured
  // keys. With one: a tenant or configured key keeps its scope when its
  // limits and budget did not change; everything else gets a fresh one
  // past every scope the prior policy or the runtime keys hold.
  std::uint32_t next = 0;
  if (prior) next = std::max(scope_count, static_cast<std::uint32_t>(prior->scopes().size()));
  // Reusable scopes that `prior` or a runtime key names are theirs (the
  // caller's list is of free ones; this guards a stale one).
  std::vector<std::uint32_t> reuse;
  if (prior && !numbers.reusable.empty()) {
    std::vector<std::uint32_t> taken = prior->held_scopes();
    for (const auto& rk : runtime) taken.push_back(rk.scope);
    std::sort(taken.begin(), taken.end());
    for (const std::uint32_t s : numbers.reusable)
      if (!std::binary_search(taken.begin(), taken.end(), s)) reuse.push_back(s);
    std::sort(reuse.begin(), reuse.end(), std::greater<>());  // taken from the back: lowest first
  }
  auto fresh = [&]() -> std::uint32_t {
    if (reuse.empty()) return next++;
    const std::uint32_t s = reuse.back();
    reuse.pop_back();
    return s;
  };
  auto tenant_scope = [&](const std::string& name, const TenantConfig& t) -> std::uint32_t {
    if (prior)
      if (const auto* old = prior->find_tenant(name); old && old->limits == t.limits && old->budget == t.budget)
        return old->scope;
    return fresh();
  };
  auto key_scope = [&](const ApiKeyConfig& k) -> std::uint32_t {
    if (prior)
      for (const auto& old : prior->keys())
        if (!old.runtime && old.id == k.id && old.limits == k.limits && old.budget == k.budget) return old.scope;
    return fresh();
  };
  std::vector<std::pair<std::uint32_t, ScopeInfo>> live;  // (scope, info) of every tenant and configured key
  p->tenants_.reserve(cfg.tenants.size());
  for (const auto& [name, t] : cfg.tenants) {  // std::map: name order
    TenantPolicy tp;
    tp.name = name;
    tp.models = ModelList(t.models);
    tp.priority = t.priority;
    tp.tier = t.tier;
    tp.limits = t.limits;
    tp.budget = t.budget;
    tp.scope = tenant_scope(name, t);
    tp.implicit = t.implicit;
    live.emplace_back(tp.scope, ScopeInfo{"tenant:" + name, t.limits, t.budget});
    p->tenants_.push_back(std::move(tp));
  }
  p->keys_.reserve(cfg.api_keys.size());
  for (const auto& k : cfg.api_keys) {
    KeyPolicy kp;
    kp.id = k.id;
    kp.sha256 = k.sha256;
    kp.tenant = p->credential_tenant(k.tenant);
    if (k.models) kp.models = ModelList(*k.models);
    kp.tier = k.tier.empty() && kp.tenant ? kp.tenant->tier : k.tier;
    kp.limits = k.limits;
    kp.budget = k.budget;
    kp.scope = key_scope(k);
    if (k.expires_at > 0) kp.expires_at = wall_from_unix_seconds(k.expires_at);
    live.emplace_back(kp.scope, ScopeInfo{"key:" + k.id, k.limits, k.budget});
    p->keys_.push_back(std::move(kp));
  }
  if (!prior) next = static_cast<std::uint32_t>(live.size());
  // Runtime keys keep the scope the key store gave them; the indexes no
  // one holds are placeholders (no limits: nothing is admitted against them).
  p->scopes_.assign(std::max(next, scope_count), ScopeInfo{"key:(retired)", {}, {}});
  for (auto& [scope, info] : live) p->scopes_[scope] = std::move(info);
  for (const auto& rk : runtime) {
    const auto& k = rk.key;
    KeyPolicy kp;
    kp.id = k.id;
    kp.sha256 = k.sha256;
    kp.tenant = p->credential_tenant(k.tenant);
    if (!kp.tenant || rk.scope >= p->scopes_.size()) continue;
    if (k.models) kp.models = ModelList(*k.models);
    kp.tier = k.tier.empty() ? kp.tenant->tier : k.tier;
    kp.limits = k.limits;
    kp.budget = k.budget;
    // A runtime key's calendar budget is aligned like the configuration's (auth.budget_utc_offset).
    if (kp.budget.calendar != core::CalendarPeriod::none) kp.budget.utc_offset_s = cfg.budget_utc_offset_s;
    kp.scope = rk.scope;
    if (k.expires_at > 0) kp.expires_at = wall_from_unix_seconds(k.expires_at);
    kp.runtime = true;
    p->scopes_[rk.scope] = ScopeInfo{"key:" + k.id, k.limits, kp.budget};
    p->keys_.push_back(std::move(kp));
  }
  // Drop keys whose tenant is missing: parse_auth_config refuses them, this guards hand-built configs.
  p->keys_.erase(std::remove_if(p->keys_.begin(), p->keys_.end(), [](const KeyPolicy& k) { return !k.tenant; }),
                 p->keys_.end());
  for (std::uint32_t i = 0; i < p->keys_.size(); ++i) p->by_digest_.emplace(p->keys_[i].sha256, i);
  for (const auto& t : p->tenants_) p->held_.push_back(t.scope);
  for (const auto& k : p->keys_) p->held_.push_back(k.scope);
  // A runtime key left out (its tenant is gone) keeps its scope for when the tenant is back.
  for (const auto& rk : runtime)
    if (rk.scope < p->scopes_.size()) p->held_.push_back(rk.scope);
  std::sort(p->held_.begin(), p->held_.end());
  p->held_.erase(std::unique(p->held_.begin(), p->held_.end()), p->held_.end());
  p->anonymous_ = p->find_tenant(cfg.anonymous_tenant);
  return p;
}

const TenantPolicy* AuthPolicy::find_tenant(std::string_view name) const noexcept {
  auto it = std::lower_bound(tenants_.begin(), tenants_.end(), name,
                             [](const TenantPolicy& t, std::string_view n) { return t.name < n; });
  if (it != tenants_.end() && it->name == name) return &*it;
  return nullptr;
}

const TenantPolicy* AuthPolicy::credential_tenant(std::string_view name) const noexcept {
  const TenantPolicy* t = find_tenant(name);
  return t && !t->implicit ? t : nullptr;
}

const KeyPolicy* AuthPolicy::find_key(const Sha256Digest& digest) const noexcept {
  auto it = by_digest_.find(digest);
  return it == by_digest_.end() ? nullptr : &keys_[it->second];
}

std::string_view to_string(AllowList l) {
  switch (l) {
    case AllowList::tenant:
      return "tenant";
    case AllowList::key:
      return "key";
    default:
      return {};
  }
}

}  // namespace weir::auth
