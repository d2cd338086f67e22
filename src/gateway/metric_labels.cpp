// The label table of Weir's metrics: MetricLabels::build gives every model,
// pool and endpoint a slot, reused across reloads by lineage (metrics.hpp).
#include <algorithm>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "gateway/metrics.hpp"

namespace weir::gateway {

namespace {
constexpr std::string_view kOtherLabel = "other";  // the label of identities past the cap
}  // namespace

struct MetricLabels::Lineage {
  std::mutex mutex;
  std::vector<std::weak_ptr<const MetricLabels>> built;  // (expired ones dropped at each build)
};

namespace {

// The slots of one family (models, pools or endpoints) in labels being built (serial `serial`): a name
// keeps its slot; a slot whose name is current in no configuration alive (none of their requests may count
// into it) is freed, and a new name takes a free slot, else one at the end.
struct SlotFamily {
  std::vector<std::string>& labels;
  std::vector<std::uint8_t>& current;
  std::vector<std::uint8_t>& vacant;
  std::vector<std::uint64_t>& epoch;
  std::uint64_t serial;
  std::vector<std::uint8_t> held;  // by slot: 1 where labels alive have it current

  void hold(const std::vector<std::uint8_t>& cur) {
    if (held.size() < cur.size()) held.resize(cur.size(), 0);
    for (std::size_t s = 0; s < cur.size(); ++s) held[s] |= cur[s];
  }
  // The slot of each of `names` (in order), current; `fresh(slot, i)` for a name new to its slot,
  // `freed(slot)` for a slot no configuration alive names. Nullopt when a new name finds no slot below `limit`.
  template <class Fresh, class Freed>
  std::optional<std::vector<std::uint32_t>> assign(std::vector<std::string> names, std::size_t limit, Fresh&& fresh,
                                                   Freed&& freed) {
    std::fill(current.begin(), current.end(), 0);
    std::unordered_map<std::string_view, std::uint32_t> index;  // (views of `labels` and `names`: neither grows)
    index.reserve(labels.size() + names.size());
    for (std::uint32_t s = 0; s < labels.size(); ++s)
      if (!vacant[s]) index.emplace(labels[s], s);
    constexpr std::uint32_t kPending = ~std::uint32_t{0};
    std::vector<std::uint32_t> slots(names.size(), kPending);
    for (std::size_t i = 0; i < names.size(); ++i)
      if (const auto it = index.find(names[i]); it != index.end()) current[slots[i] = it->second] = 1;
    for (std::size_t s = 0; s < labels.size(); ++s)
      if (!vacant[s] && !current[s] && !(s < held.size() && held[s])) {
        index.erase(labels[s]);
        vacant[s] = 1;
        epoch[s] = serial;
        std::string().swap(labels[s]);
        freed(s);
      }
    std::size_t cursor = 0, added = 0;
    std::vector<std::uint8_t> is_new(names.size(), 0);
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (slots[i] != kPending) continue;
      if (const auto it = index.find(names[i]); it != index.end()) {  // (named twice)
        slots[i] = it->second;
        continue;
      }
      while (cursor < vacant.size() && !(vacant[cursor] && !(cursor < held.size() && held[cursor]))) ++cursor;
      std::uint32_t s;
      if (cursor < vacant.size()) {
        s = static_cast<std::uint32_t>(cursor++);
      } else {
        if (labels.size() + added >= limit) return std::nullopt;
        s = static_cast<std::uint32_t>(labels.size() + added++);
      }
      slots[i] = s;
      is_new[i] = 1;
      index.emplace(names[i], s);
    }
    labels.resize(labels.size() + added);
    current.resize(labels.size(), 0);
    vacant.resize(labels.size(), 0);
    epoch.resize(labels.size(), 0);
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::uint32_t s = slots[i];
      current[s] = 1;
      if (!is_new[i]) continue;
      labels[s] = names[i];
      vacant[s] = 0;
      epoch[s] = serial;
      fresh(s, i);
    }
    return slots;
  }
};

}  // namespace

std::shared_ptr<const MetricLabels> MetricLabels::build(const core::Config& cfg, const auth::AuthPolicy* policy,
                                                        const MetricLabels* previous) {
  auto l = previous ? std::make_shared<MetricLabels>(*previous) : std::make_shared<MetricLabels>();
  if (!previous) l->settings = cfg.server.metrics;
  if (!l->lineage) l->lineage = std::make_shared<Lineage>();
  const auto& mc = l->settings;
  // The labels alive (those of the generations in use, and shards' copies), `previous` among them.
  std::vector<std::shared_ptr<const MetricLabels>> alive;
  {
    const std::lock_guard lock(l->lineage->mutex);
    auto& built = l->lineage->built;
    std::erase_if(built, [](const auto& w) { return w.expired(); });
    for (const auto& w : built)
      if (auto p = w.lock()) {
        l->serial = std::max(l->serial, p->serial);
        alive.push_back(std::move(p));
      }
  }
  if (previous) l->serial = std::max(l->serial, previous->serial);
  ++l->serial;
  SlotFamily models{l->models, l->model_current, l->model_vacant, l->model_epoch, l->serial, {}};
  SlotFamily pools{l->pools, l->pool_current, l->pool_vacant, l->pool_epoch, l->serial, {}};
  SlotFamily endpoints{l->endpoints, l->endpoint_current, l->endpoint_vacant, l->endpoint_epoch, l->serial, {}};
  const auto hold = [&](const MetricLabels& o) {
    models.hold(o.model_current);
    pools.hold(o.pool_current);
    endpoints.hold(o.endpoint_current);
  };
  for (const auto& o : alive) hold(*o);
  if (previous) hold(*previous);
  // Models: by name.
  std::vector<std::string> names;
  names.reserve(cfg.models.size());
  for (const auto& m : cfg.models) names.push_back(core::escape_label(m.name));
  auto model_slots = models.assign(
      std::move(names), kModelSlots,
      [&](std::size_t s, std::size_t i) {
        if (s >= l->model_names.size()) l->model_names.resize(s + 1);
        l->model_names[s] = cfg.models[i].name;
      },
      [&](std::size_t s) { std::string().swap(l->model_names[s]); });
  if (!model_slots) return nullptr;
  l->model_slot = std::move(*model_slots);
  // Pools: by name.
  names.clear();
  for (const auto& p : cfg.pools) names.push_back(fmt::format("pool=\"{}\"", core::escape_label(p.name)));
  l->pool_slot = *pools.assign(
      std::move(names), SIZE_MAX, [](std::size_t, std::size_t) {}, [](std::size_t) {});
  l->pool_queued.assign(l->pools.size(), 0);
  for (std::size_t p = 0; p < cfg.pools.size(); ++p) l->pool_queued[l->pool_slot[p]] = cfg.pools[p].queue.enabled;
  // Endpoints: by pool name and endpoint as shown (secrets in a query redacted).
  names.clear();
  l->endpoint_base.clear();
  for (const auto& p : cfg.pools) {
    l->endpoint_base.push_back(static_cast<std::uint32_t>(names.size()));
    for (const auto& e : p.endpoints)
      names.push_back(
          fmt::format("pool=\"{}\",endpoint=\"{}\"", core::escape_label(p.name), core::escape_label(e.display)));
  }
  l->endpoint_base.push_back(static_cast<std::uint32_t>(names.size()));
  l->endpoint_slots = *endpoints.assign(
      std::move(names), SIZE_MAX, [](std::size_t, std::size_t) {}, [](std::size_t) {});
  {
    const std::lock_guard lock(l->lineage->mutex);
    l->lineage->built.push_back(l);
  }
  // Tenants and keys: current while the policy names them (marked after their slots below); "other" always.
  const auto mark_current = [](std::vector<std::uint8_t>& flags, const std::vector<std::string>& names,
                               const std::vector<std::uint16_t>& named_slots) {
    flags.assign(names.size(), 0);
    if (flags.empty()) return;
    flags.back() = 1;  // "other"
    for (const std::uint16_t s : named_slots)
      if (s != MetricIdentity::kOther && s < flags.size()) flags[s] = 1;
  };
  if (!policy) {
    mark_current(l->tenant_current, l->tenants, {});
    mark_current(l->key_current, l->key_ids, {});
    return l;
  }
  // Identity slots by admission scope. A name keeps its slot; a new one gets
  // the next while fewer than the cap have one, else "other" (the last entry).
  const auto named = [](std::vector<std::string>& names, std::uint32_t cap, std::string_view name,
                        std::vector<std::string>* raw = nullptr) -> std::uint16_t {
    const std::string label = core::escape_label(name);
    if (names.empty()) names.emplace_back(kOtherLabel);
    // A tenant (or key) literally named "other" is the overflow series itself (docs/observability.md): a
    // second series of that label set would make the exposition invalid (duplicate samples).
    if (label == kOtherLabel) return MetricIdentity::kOther;
    const auto end = names.end() - 1;  // "other"
    if (const auto it = std::find(names.begin(), end, label); it != end)
      return static_cast<std::uint16_t>(it - names.begin());
    if (names.size() - 1 >= cap) return MetricIdentity::kOther;
    names.insert(end, label);
    if (raw) raw->emplace_back(name);
    return static_cast<std::uint16_t>(names.size() - 2);
  };
  // The previous labels' slots of the scopes this policy does not name
  // stay: a request admitted under an older policy still counts under its
  // tenant. One it names may be reused (admission/scope_ledger.hpp: no
  // request of its former holder runs any more): it is this policy's alone.
  const auto scopes = std::max(policy->scopes().size(), l->tenant_slot.size());
  l->tenant_slot.resize(scopes, MetricIdentity::kOther);
  l->key_slot.resize(scopes, MetricIdentity::kOther);
  for (const std::uint32_t s : policy->held_scopes())
    if (s < scopes) l->tenant_slot[s] = l->key_slot[s] = MetricIdentity::kOther;
  std::vector<std::uint16_t> tenants_named, keys_named;
  if (mc.tenant_label) {
    if (l->tenants.empty()) l->tenants.emplace_back(kOtherLabel);
    for (const auto& t : policy->tenants())  // name order
      if (t.scope < scopes)
        tenants_named.push_back(l->tenant_slot[t.scope] = named(l->tenants, mc.max_tenants, t.name, &l->tenant_names));
  }
  if (mc.key_id_label) {
    if (l->key_ids.empty()) l->key_ids.emplace_back(kOtherLabel);
    for (const auto& k : policy->keys())  // configuration order; runtime keys are "other"
      if (!k.runtime && k.scope < scopes)
        keys_named.push_back(l->key_slot[k.scope] = named(l->key_ids, mc.max_key_ids, k.id));
  }
  mark_current(l->tenant_current, l->tenants, tenants_named);
  mark_current(l->key_current, l->key_ids, keys_named);
  return l;
}

}  // namespace weir::gateway
