#include "gateway/admin.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <ctime>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <boost/json.hpp>
#include <boost/url/pct_string_view.hpp>

#include "api/json_write.hpp"
#include "api/wide_integers.hpp"
#include "auth/authenticator.hpp"
#include "auth/redis_keys.hpp"
#include "core/json_text.hpp"
#include "core/process_metrics.hpp"
#include "gateway/worker.hpp"
#include "http/shortage.hpp"

namespace weir::gateway {

tl::expected<AnthropicPage, core::Error> anthropic_page(std::string_view query) {
  AnthropicPage page;
  bool limit_seen = false;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const auto eq = pair.find('=');
    const std::string_view key = pair.substr(0, eq);
    const std::string_view raw = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    std::string* cursor = key == "after_id" ? &page.after_id : key == "before_id" ? &page.before_id : nullptr;
    if (cursor == nullptr && key != "limit") continue;  // (another API's parameter: not this one's to refuse)
    const std::string_view name = cursor == &page.after_id ? "after_id" : cursor ? "before_id" : "limit";
    if ((cursor && !cursor->empty()) || (!cursor && limit_seen))
      return tl::unexpected(core::bad_request(fmt::format("{} is given more than once.", name), name));
    // application/x-www-form-urlencoded, as the SDKs write a query: '+' is a space, then %XX.
    std::string plus_free(raw);
    std::replace(plus_free.begin(), plus_free.end(), '+', ' ');
    const auto pct = boost::urls::make_pct_string_view(plus_free);
    if (!pct) return tl::unexpected(core::bad_request(fmt::format("{} has an invalid percent escape.", name), name));
    std::string value = pct->decode();
    if (cursor) {
      if (value.empty())
        return tl::unexpected(core::bad_request(fmt::format("{} is empty: name a model id.", name), name));
      *cursor = std::move(value);
      continue;
    }
    limit_seen = true;
    std::size_t n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size() || n < 1 || n > 1000)
      return tl::unexpected(core::bad_request(
          fmt::format("limit must be an integer from 1 to 1000, not '{}'.", core::utf8_prefix(value, 32)), "limit"));
    page.limit = n;
  }
  if (!page.after_id.empty() && !page.before_id.empty())
    return tl::unexpected(
        core::bad_request("after_id and before_id are both given: page one way at a time.", "before_id"));
  return page;
}

namespace {
const std::int64_t kStartTime =
    std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

// Unix seconds as RFC 3339 in UTC ("2025-05-14T00:00:00Z"): Anthropic's `created_at`.
std::string rfc3339(std::int64_t unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

// A model in Anthropic's shape (Anthropic API reference, "Models"; the SDKs' ModelInfo, whose `lifecycle` the
// Java SDK requires): {"type":"model","id","display_name","created_at","lifecycle":"active",
// "max_input_tokens","max_tokens":null,"capabilities":null,"line":null,"deprecated_at":null,"retires_at":null}.
// The display name is the id (Weir knows no other); max_input_tokens is vLLM's max_model_len where Weir knows
// it (models.NAME.max_model_len, or the pool's own list), else null; what Weir does not know is null, never
// made up (max_tokens: vLLM bounds it by what the prompt leaves of the context, not by a number of its own).
struct AnthropicModel {
  std::string_view id;
  std::int64_t created = 0;         // Unix seconds
  std::uint64_t max_model_len = 0;  // tokens; 0 = unknown
};

void append_anthropic_model(std::string& out, const AnthropicModel& m) {
  out += R"({"type":"model","id":)";
  core::append_json_string(out, m.id);
  out += R"(,"display_name":)";
  core::append_json_string(out, m.id);
  out += R"(,"created_at":")";
  out += rfc3339(m.created);
  out += R"(","lifecycle":"active","max_input_tokens":)";
  if (m.max_model_len != 0)
    fmt::format_to(std::back_inserter(out), "{}", m.max_model_len);
  else
    out += "null";
  out += R"(,"max_tokens":null,"capabilities":null,"line":null,"deprecated_at":null,"retires_at":null})";
}

// One page of Anthropic's list, as `query` asks (anthropic_page()): {"data":[...],"has_more","first_id",
// "last_id"} (null ids for an empty page). has_more says whether models remain in the page's direction
// (after it, or before it for a before_id), as Anthropic's does: an SDK's auto-paging asks for the next page
// with after_id = last_id (before_id = first_id) while it is true.
tl::expected<void, core::Error> append_anthropic_list(std::string& out, const std::vector<AnthropicModel>& models,
                                                      std::string_view query) {
  auto page = anthropic_page(query);
  if (!page) return tl::unexpected(std::move(page.error()));
  const auto index_of = [&](std::string_view id) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < models.size(); ++i)
      if (models[i].id == id) return i;
    return std::nullopt;
  };
  // [begin, end) of `models`; more: models remain past the page in its direction.
  std::size_t begin = 0;
  std::size_t end = std::min(page->limit, models.size());
  bool more = end < models.size();
  for (const auto& [cursor, name, after] : {std::tuple{std::string_view(page->after_id), "after_id", true},
                                            std::tuple{std::string_view(page->before_id), "before_id", false}}) {
    if (cursor.empty()) continue;
    // (A model the principal may not use is not in its list: named, it is no model, as for retrieve().)
    const auto at = index_of(cursor);
    if (!at)
      return tl::unexpected(core::bad_request(
          fmt::format("{} '{}' names no model in the list.", name, core::utf8_prefix(cursor, core::kMaxEchoBytes)),
          name));
    if (after) {
      begin = *at + 1;
      end = std::min(models.size(), begin + page->limit);
      more = end < models.size();
    } else {
      end = *at;
      begin = end > page->limit ? end - page->limit : 0;
      more = begin > 0;
    }
  }
  out += R"({"data":[)";
  for (std::size_t i = begin; i < end; ++i) {
    if (i > begin) out += ',';
    append_anthropic_model(out, models[i]);
  }
  out += more ? R"(],"has_more":true,"first_id":)" : R"(],"has_more":false,"first_id":)";
  if (begin == end) {
    out += R"(null,"last_id":null})";
    return {};
  }
  core::append_json_string(out, models[begin].id);
  out += R"(,"last_id":)";
  core::append_json_string(out, models[end - 1].id);
  out += '}';
  return {};
}

// One model of the list in OpenAI's shape, with vLLM's `root` (the canonical name) and, when configured,
// its `max_model_len` (models.NAME.max_model_len), as vLLM lists it.
void append_model(std::string& out, std::string_view id, const core::ModelConfig& m) {
  out += R"({"id":)";
  core::append_json_string(out, id);
  fmt::format_to(std::back_inserter(out), R"(,"object":"model","created":{},"owned_by":)", kStartTime);
  core::append_json_string(out, m.owned_by);
  out += R"(,"root":)";
  core::append_json_string(out, m.name);
  if (m.max_model_len != 0) fmt::format_to(std::back_inserter(out), R"(,"max_model_len":{})", m.max_model_len);
  out += "}";
}
// weir_budget_{limit,remaining}_usd{tenant}: every budgeted tenant with a
// tenant label of its own (MetricLabels), read from the limiter (atomics:
// safe on any thread). Remaining is the limit minus the period's settled
// spend; it goes below 0 when the last requests cost more than their
// reservations (the only way spend passes a limit: docs/admission.md).
void append_budget_metrics(std::string& out, const auth::AuthPolicy& policy, admission::Limiter& limiter,
                           const MetricLabels& labels) {
  // The budgeted tenants with a tenant label of their own.
  std::vector<std::pair<const auth::TenantPolicy*, std::string_view>> shown;
  if (!labels.tenants.empty())
    for (const auto& t : policy.tenants()) {
      const auto slot = t.scope < labels.tenant_slot.size() ? labels.tenant_slot[t.scope] : MetricIdentity::kOther;
      if (t.budget.any() && slot != MetricIdentity::kOther && slot < labels.tenants.size())
        shown.emplace_back(&t, labels.tenants[slot]);
    }
  if (shown.empty()) return;
  core::PromWriter w(out);
  w.header("weir_budget_limit_usd", "gauge", "The tenant's budget per period (tenants.X.budget), USD.");
  for (const auto& [t, label] : shown)
    w.sample("weir_budget_limit_usd", fmt::format("tenant=\"{}\"", label),
             static_cast<double>(t->budget.limit_nano_usd) / 1e9);
  w.header("weir_budget_remaining_usd", "gauge",
           "What is left of the tenant's budget in the current period (limit minus settled spend), USD.");
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [t, label] : shown)
    w.sample("weir_budget_remaining_usd", fmt::format("tenant=\"{}\"", label),
             static_cast<double>(t->budget.limit_nano_usd - limiter.spent(t->scope, now)) / 1e9);
}

// The merged health of every endpoint (routing::HealthBoard, atomics) and
// the saturation of the pools with a queue (the scraped loads).
void append_health_metrics(std::string& out, const Generation& gen) {
  const auto& cfg = *gen.config;
  const auto now = std::chrono::steady_clock::now();
  core::PromWriter w(out);
  const std::size_t pools = std::min(cfg.pools.size(), gen.pools.size());
  w.header("weir_upstream_endpoint_state", "gauge",
           "Workers on which the endpoint is closed (in use), open (ejected: its circuit breaker open) or half_open "
           "(letting trial requests through).");
  for (std::size_t p = 0; p < pools; ++p) {
    const auto& st = *gen.pools[p].state;
    for (std::uint32_t e = 0; e < st.health.endpoints(); ++e) {
      std::array<std::uint32_t, static_cast<std::size_t>(routing::HealthState::count_)> n{};
      for (std::uint32_t k = 0; k < st.health.workers(); ++k)
        ++n[static_cast<std::size_t>(st.health.state(e, k, now, st.policy))];
      for (auto s : {routing::HealthState::closed, routing::HealthState::open, routing::HealthState::half_open}) {
        if (s == routing::HealthState::half_open && !st.policy.breaker()) continue;
        w.sample("weir_upstream_endpoint_state",
                 fmt::format("pool=\"{}\",endpoint=\"{}\",state=\"{}\"", core::escape_label(cfg.pools[p].name),
                             core::escape_label(cfg.pools[p].endpoints[e].display), routing::health_state_label(s)),
                 static_cast<double>(n[static_cast<std::size_t>(s)]));
      }
    }
  }
  w.header("weir_upstream_available_endpoints", "gauge",
           "Endpoints of the pool that some worker may send a request to now (closed or half-open there).");
  for (std::size_t p = 0; p < pools; ++p) {
    const auto& st = *gen.pools[p].state;
    w.sample("weir_upstream_available_endpoints", fmt::format("pool=\"{}\"", core::escape_label(cfg.pools[p].name)),
             static_cast<double>(st.health.available_endpoints(now, st.policy)));
  }
  // The load scrapes (routing/load_scraper.hpp), for the pools that scrape.
  bool any_scraped = false;
  for (std::size_t p = 0; p < pools; ++p) any_scraped |= cfg.pools[p].load_metrics.enabled;
  if (any_scraped) {
    auto each_endpoint = [&](auto&& f) {
      for (std::size_t p = 0; p < pools; ++p) {
        if (!cfg.pools[p].load_metrics.enabled) continue;
        const auto& st = *gen.pools[p].state;
        for (std::uint32_t e = 0; e < st.loads.size(); ++e)
          f(st.loads, e,
            fmt::format("pool=\"{}\",endpoint=\"{}\"", core::escape_label(cfg.pools[p].name),
                        core::escape_label(cfg.pools[p].endpoints[e].display)));
      }
    };
    w.header("weir_load_scrape_failures_total", "counter",
             "Failed scrapes of the endpoint's load_metrics page, by reason: connect, timeout, tls, read, too_large "
             "(over 4 MiB), status (not 200), not_vllm (no readable vllm:num_requests_running or _waiting).");
    each_endpoint([&](const routing::LoadBoard& b, std::uint32_t e, const std::string& labels) {
      for (std::size_t r = 0; r < static_cast<std::size_t>(routing::ScrapeFailure::count_); ++r) {
        const auto f = static_cast<routing::ScrapeFailure>(r);
        w.sample("weir_load_scrape_failures_total",
                 fmt::format("{},reason=\"{}\"", labels, routing::scrape_failure_label(f)),
                 static_cast<double>(b.failures(e, f)));
      }
    });
    w.header("weir_load_scraped", "gauge",
             "1 while the endpoint has a usable load scrape (the last good one, through 2 failed scrapes), 0 when "
             "it has none: the pool's load-aware balancing then compares this worker's in-flight requests.");
    each_endpoint([&](const routing::LoadBoard& b, std::uint32_t e, const std::string& labels) {
      w.sample("weir_load_scraped", labels, b.read(e).seq != 0 ? 1.0 : 0.0);
    });
    w.header("weir_load_requests", "gauge",
             "The endpoint's requests as its last usable load scrape reported them (vllm:num_requests_running and "
             "_waiting, summed over engines), by state; none while it has no usable scrape.");
    each_endpoint([&](const routing::LoadBoard& b, std::uint32_t e, const std::string& labels) {
      const auto l = b.read(e);
      if (l.seq == 0) return;
      w.sample("weir_load_requests", fmt::format("{},state=\"running\"", labels), static_cast<double>(l.running));
      w.sample("weir_load_requests", fmt::format("{},state=\"waiting\"", labels), static_cast<double>(l.waiting));
    });
  }
  bool any_saturation = false;
  for (std::size_t p = 0; p < pools; ++p) any_saturation |= cfg.pools[p].queue.enabled && cfg.pools[p].queue.saturation;
  if (!any_saturation) return;
  w.header("weir_pool_saturated", "gauge",
           "1 while every endpoint of the pool with a fresh /metrics scrape is saturated (queue.saturation: "
           "vllm:num_requests_waiting or vllm:kv_cache_usage_perc at its threshold).");
  for (std::size_t p = 0; p < pools; ++p) {
    const auto& qc = cfg.pools[p].queue;
    if (!qc.enabled || !qc.saturation) continue;
    const auto& st = *gen.pools[p].state;
    bool saturated = false;
    for (std::uint32_t e = 0; e < st.loads.size(); ++e) {
      if (!st.health.available(e, now, st.policy)) continue;
      const auto l = st.loads.read(e);
      if (l.seq == 0 || !routing::endpoint_saturated(l, qc)) {
        saturated = false;
        break;
      }
      saturated = true;
    }
    w.sample("weir_pool_saturated", fmt::format("pool=\"{}\"", core::escape_label(cfg.pools[p].name)),
             saturated ? 1.0 : 0.0);
  }
}
}  // namespace

std::string ready_problem(const Generation& gen, bool draining) {
  if (draining) return "Weir is draining.";
  const auto& cfg = *gen.config;
  if (cfg.server.ready_pools == core::ServerConfig::ReadyPools::off) return {};
  // The pools that serve a model first (a pool only a fallback names is a spare), and the default pool.
  std::vector<bool> used(cfg.pools.size(), false);
  for (const auto& m : cfg.models) used[m.pool] = true;
  if (cfg.default_pool) used[*cfg.default_pool] = true;
  const auto now = std::chrono::steady_clock::now();
  std::string down;
  std::size_t used_n = 0, down_n = 0;
  for (std::size_t p = 0; p < cfg.pools.size() && p < gen.pools.size(); ++p) {
    if (!used[p]) continue;
    ++used_n;
    const auto& st = *gen.pools[p].state;
    if (st.health.available_endpoints(now, st.policy) > 0) continue;
    ++down_n;
    fmt::format_to(std::back_inserter(down), "{}`{}`", down.empty() ? "" : ", ", cfg.pools[p].name);
  }
  if (down_n == 0) return {};
  if (cfg.server.ready_pools == core::ServerConfig::ReadyPools::any && down_n < used_n) return {};
  return fmt::format("No endpoint of pool{} {} is available (all ejected).", down_n > 1 ? "s" : "", down);
}

namespace {

// A /v1/models/{id} path's id, percent-decoded (RFC 3986 §2.1: the OpenAI SDK
// sends "meta-llama/Llama-3.1-8B" as "meta-llama%2FLlama-3.1-8B"; an invalid
// escape is taken as written); nullopt for the list's path.
std::optional<std::string> model_id_of(std::string_view path) {
  constexpr std::string_view prefix = "/v1/models/";
  if (!path.starts_with(prefix)) return std::nullopt;
  std::string_view id = path.substr(prefix.size());
  if (id.find('%') != std::string_view::npos)
    if (auto pct = boost::urls::make_pct_string_view(id); pct) return pct->decode();
  return std::string(id);
}

}  // namespace

tl::expected<std::string, core::Error> upstream_models_response(std::string_view upstream_list, std::string_view path,
                                                                const auth::Principal* principal, bool anthropic,
                                                                std::string_view query) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(boost::json::string_view(upstream_list.data(), upstream_list.size()), ec);
  // An integer beyond 64 bits in the upstream's list is written back exactly
  // (api/wide_integers.hpp): parsed again with it as a token, restored below.
  api::WideIntegers wide;
  std::string protected_list;
  if (!ec && api::has_wide_integer(v))
    if (const auto text = wide.protect(upstream_list, protected_list); !wide.empty())
      v = boost::json::parse(boost::json::string_view(text.data(), text.size()), ec);
  auto* data = !ec && v.is_object() ? v.get_object().if_contains("data") : nullptr;
  if (data == nullptr || !data->is_array()) return std::string();
  const auto written = [&](const boost::json::value& x) {
    std::string out = api::to_json(x);
    wide.restore(out);
    return out;
  };
  auto visible = [&](const boost::json::value& m) {
    const auto* id = m.is_object() ? m.get_object().if_contains("id") : nullptr;
    if (id == nullptr || !id->is_string()) return principal == nullptr;
    return principal == nullptr ||
           auth::Authenticator::check_model(*principal, std::string_view(id->get_string())).has_value();
  };
  auto& list = data->get_array();
  // (Anthropic's shape: the id and the OpenAI object's `created`, the list's models that have an id.)
  const auto created_of = [](const boost::json::value& m) -> std::int64_t {
    const auto* c = m.get_object().if_contains("created");
    return c && c->is_int64() ? c->get_int64() : c && c->is_uint64() ? static_cast<std::int64_t>(c->get_uint64()) : 0;
  };
  const auto max_model_len_of = [](const boost::json::value& m) -> std::uint64_t {
    const auto* v = m.get_object().if_contains("max_model_len");
    return v && v->is_uint64() ? v->get_uint64() : v && v->is_int64() && v->get_int64() > 0 ? v->get_int64() : 0;
  };
  const auto id_of = [](const boost::json::value& m) -> std::optional<std::string_view> {
    const auto* mid = m.is_object() ? m.get_object().if_contains("id") : nullptr;
    if (mid == nullptr || !mid->is_string()) return std::nullopt;
    return std::string_view(mid->get_string());
  };
  if (const auto id = model_id_of(path)) {
    for (const auto& m : list) {
      if (id_of(m) == std::string_view(*id) && visible(m)) {
        if (!anthropic) return written(m);
        std::string out;
        append_anthropic_model(out, {*id, created_of(m), max_model_len_of(m)});
        return out;
      }
    }
    return tl::unexpected(core::model_not_found(*id));
  }
  if (anthropic) {
    std::vector<AnthropicModel> shown;
    for (const auto& m : list)
      if (const auto id = id_of(m); id && visible(m)) shown.push_back({*id, created_of(m), max_model_len_of(m)});
    std::string out;
    if (auto ok = append_anthropic_list(out, shown, query); !ok) return tl::unexpected(std::move(ok.error()));
    return out;
  }
  if (principal == nullptr) return std::string();  // every model: the upstream's bytes
  boost::json::array kept;
  for (auto& m : list)
    if (visible(m)) kept.push_back(std::move(m));
  list = std::move(kept);
  return written(v);
}

tl::expected<std::string, core::Error> models_response(const core::Config& cfg, std::string_view path,
                                                       const auth::Principal* principal, bool anthropic,
                                                       std::string_view query) {
  auto visible = [&](const core::ModelConfig& m) {
    return !principal || auth::Authenticator::check_model(*principal, m.name).has_value();
  };
  std::string out;
  if (const auto wanted = model_id_of(path)) {
    const std::string_view id = *wanted;
    for (const auto& m : cfg.models) {
      if (!visible(m)) continue;
      if (m.name == id || std::find(m.aliases.begin(), m.aliases.end(), id) != m.aliases.end()) {
        if (anthropic)
          append_anthropic_model(out, {id, kStartTime, m.max_model_len});
        else
          append_model(out, id, m);
        return out;
      }
    }
    return tl::unexpected(core::model_not_found(id));
  }
  if (anthropic) {
    std::vector<AnthropicModel> shown;
    for (const auto& m : cfg.models) {
      if (!visible(m)) continue;
      shown.push_back({m.name, kStartTime, m.max_model_len});
      for (const auto& a : m.aliases) shown.push_back({a, kStartTime, m.max_model_len});
    }
    if (auto ok = append_anthropic_list(out, shown, query); !ok) return tl::unexpected(std::move(ok.error()));
    return out;
  }
  out += R"({"object":"list","data":[)";
  bool first = true;
  for (const auto& m : cfg.models) {
    if (!visible(m)) continue;
    if (!first) out += ",";
    first = false;
    append_model(out, m.name, m);
    for (const auto& a : m.aliases) {
      out += ",";
      append_model(out, a, m);
    }
  }
  out += "]}";
  return out;
}

http::Task<void> collect_metrics_text(Worker& self, std::string& out) {
  // This worker's view: its generation and its authenticator's policy.
  const std::shared_ptr<const Generation> gen = self.generation()->shared;
  const std::shared_ptr<const auth::AuthPolicy> policy =
      self.authenticator() ? self.authenticator()->policy() : std::shared_ptr<const auth::AuthPolicy>();
  co_await collect_metrics_text(self.shared(), self.io(), out, gen, policy);
}

http::Task<std::shared_ptr<MetricsShard>> collect_metrics(Shared& shared, boost::asio::io_context& home,
                                                          const std::shared_ptr<const MetricLabels>& labels) {
  struct Gather {
    Gather(http::Executor ex, std::shared_ptr<const MetricLabels> labels, std::size_t n)
        : total(std::move(labels)), remaining(n), timer(ex) {}
    MetricsShard total;
    std::size_t remaining;
    http::Timer timer;
  };
  // A worker on a later generation's labels brings them along (MetricsShard::merge).
  auto g = std::make_shared<Gather>(home.get_executor(), labels, shared.workers.size());
  for (Worker* w : shared.workers) {
    if (w->stopped()) {  // drained: its loop runs no more, its last counts are kept
      g->total.merge(w->final_metrics());
      --g->remaining;
      continue;
    }
    boost::asio::post(w->io(), [w, g, &home] {
      MetricsShard copy = w->metrics_snapshot();  // on w's own thread
      boost::asio::post(home, [g, copy = std::move(copy)]() mutable {
        g->total.merge(copy);
        if (--g->remaining == 0) g->timer.cancel();
      });
    });
  }
  if (g->remaining > 0) {
    g->timer.expires_after(std::chrono::seconds(1));
    co_await g->timer.async_wait(http::use_task);
  }
  // The late workers' copies (if any) still merge into g->total: hand out a copy.
  co_return std::make_shared<MetricsShard>(g->total);
}

http::Task<void> collect_metrics_text(Shared& shared, boost::asio::io_context& home, std::string& out,
                                      const std::shared_ptr<const Generation>& gen,
                                      const std::shared_ptr<const auth::AuthPolicy>& policy) {
  const std::shared_ptr<MetricsShard> total = co_await collect_metrics(shared, home, gen->labels);
  total->render(
      out, shared.log_sink ? shared.log_sink->write_errors() : 0, shared.log_sink ? shared.log_sink->lines_lost() : 0,
      shared.log_sink ? shared.log_sink->reopen_failures() : 0, shared.log_sink && shared.log_sink->reopen_pending());
  append_health_metrics(out, *gen);
  if (shared.limiter && policy) append_budget_metrics(out, *policy, *shared.limiter, total->labels());
  if (shared.limiter && shared.limiter->grows()) {
    // The limiter's scope count (control thread, as its writer): bounded by the scopes held at once when
    // retired ones are reused, growing with every change of limits otherwise (docs/admission.md).
    core::PromWriter w(out);
    w.header("weir_admission_scopes", "gauge",
             "Admission scopes the limiter holds state for: tenants and keys, those replaced by a change of "
             "limits or budget that are not reused yet, and keys in Redis with limits of their own.");
    w.sample("weir_admission_scopes", "", static_cast<double>(shared.limiter->scope_count()));
  }
  {
    // Configuration reloads (docs/operations.md): atomics the control thread writes.
    const auto& r = shared.reloads;
    core::PromWriter w(out);
    w.header("weir_config_reloads_total", "counter",
             "Configuration reloads (SIGHUP, server.watch_config) by result: success (applied), failure (the file was "
             "refused: invalid, or a change that needs a restart; the running configuration was kept).");
    w.sample("weir_config_reloads_total", "result=\"success\"", r.succeeded.load(std::memory_order_relaxed));
    w.sample("weir_config_reloads_total", "result=\"failure\"", r.failed.load(std::memory_order_relaxed));
    w.header("weir_config_last_reload_successful", "gauge",
             "1 when the last reload attempt was applied (or none was made), 0 when it was refused.");
    w.sample("weir_config_last_reload_successful", "", r.last_ok.load(std::memory_order_relaxed) ? 1.0 : 0.0);
    w.header("weir_config_last_reload_success_timestamp_seconds", "gauge",
             "Unix time the running configuration was loaded (start-up, or the last applied reload).");
    w.sample("weir_config_last_reload_success_timestamp_seconds", "",
             static_cast<double>(r.last_success_unix_s.load(std::memory_order_relaxed)));
    w.header("weir_config_generation", "gauge",
             "The running configuration generation: 1 at start-up, +1 per applied reload.");
    w.sample("weir_config_generation", "", static_cast<double>(r.generation.load(std::memory_order_relaxed)));
  }
  if (shared.request_log) {
    // The request-log store's writer (atomics, safe to read here).
    const auto s = shared.request_log->stats();
    core::PromWriter w(out);
    w.header("weir_request_log_written_total", "counter", "Request records stored (request_log:).");
    w.sample("weir_request_log_written_total", "", s.written);
    w.header("weir_request_log_dropped_total", "counter",
             "Request records not stored: queue_full (the writer is behind or the store is down), write_error (their "
             "transaction failed), shutdown (the drain ran out of time).");
    w.sample("weir_request_log_dropped_total", "reason=\"queue_full\"", s.dropped_queue_full);
    w.sample("weir_request_log_dropped_total", "reason=\"write_error\"", s.dropped_write_error);
    w.sample("weir_request_log_dropped_total", "reason=\"shutdown\"", s.dropped_shutdown);
    w.header("weir_request_log_errors_total", "counter",
             "Request-log store errors: failed opens, statements and commits.");
    w.sample("weir_request_log_errors_total", "", s.errors);
    w.header("weir_request_log_deleted_total", "counter", "Rows deleted by retention (max_age, max_rows).");
    w.sample("weir_request_log_deleted_total", "", s.deleted);
    w.header("weir_request_log_bodies_dropped_total", "counter",
             "Records stored without their captured bodies: the queues already held 32 MiB of bodies per worker "
             "(capture_bodies while the store is slow or down).");
    w.sample("weir_request_log_bodies_dropped_total", "", s.bodies_dropped);
    w.header("weir_request_log_queued", "gauge", "Request records waiting in the workers' queues.");
    w.sample("weir_request_log_queued", "", static_cast<double>(s.queued));
    w.header("weir_request_log_open", "gauge", "1 while the request-log store is open for writing.");
    w.sample("weir_request_log_open", "", static_cast<double>(s.open));
  }
  if (shared.tracer) {
    // The trace exporter (atomics, safe to read here). Units: spans.
    const auto s = shared.tracer->stats();
    core::PromWriter w(out);
    w.header("weir_tracing_spans_exported_total", "counter", "Spans the OTLP collector accepted (tracing:).");
    w.sample("weir_tracing_spans_exported_total", "", s.exported);
    w.header("weir_tracing_spans_dropped_total", "counter",
             "Spans not delivered: queue_full (the exporter is behind), export_failed (their batch could not be "
             "delivered after retries), rejected (the collector refused them), shutdown (the drain ran out of time).");
    w.sample("weir_tracing_spans_dropped_total", "reason=\"queue_full\"", s.dropped_queue_full);
    w.sample("weir_tracing_spans_dropped_total", "reason=\"export_failed\"", s.dropped_export);
    w.sample("weir_tracing_spans_dropped_total", "reason=\"rejected\"", s.dropped_rejected);
    w.sample("weir_tracing_spans_dropped_total", "reason=\"shutdown\"", s.dropped_shutdown);
    w.header("weir_tracing_exports_total", "counter", "OTLP export requests the collector answered 2xx.");
    w.sample("weir_tracing_exports_total", "", s.export_requests);
    w.header("weir_tracing_export_errors_total", "counter",
             "OTLP export requests that failed (connection, timeout, non-2xx answer), retries included.");
    w.sample("weir_tracing_export_errors_total", "", s.export_errors);
    w.header("weir_tracing_queued", "gauge", "Traces (one per sampled request) waiting in the workers' queues.");
    w.sample("weir_tracing_queued", "", static_cast<double>(s.queued));
  }
  if (shared.redis_limiter) {
    // Shared limits: the state of the Redis leases (atomics, safe to read here).
    const auto s = shared.redis_limiter->stats();
    core::PromWriter w(out);
    w.header("weir_redis_degraded", "gauge", "1 while Redis is unreachable and limits follow redis.fail_open.");
    w.sample("weir_redis_degraded", "", static_cast<double>(s.degraded));
    w.header("weir_redis_outages_total", "counter", "Times Redis became unreachable.");
    w.sample("weir_redis_outages_total", "", s.outages);
    w.header("weir_redis_syncs_total", "counter", "Lease sync round trips to Redis that succeeded.");
    w.sample("weir_redis_syncs_total", "", s.syncs);
    w.header("weir_redis_sync_failures_total", "counter", "Lease sync round trips that failed.");
    w.sample("weir_redis_sync_failures_total", "", s.sync_failures);
    w.header("weir_redis_refills_total", "counter", "Requests that waited once for a lease refill.");
    w.sample("weir_redis_refills_total", "", s.refills);
    w.header("weir_redis_fallback_takes_total", "counter",
             "Admission decisions made by the local fallback during an outage.");
    w.sample("weir_redis_fallback_takes_total", "", s.fallback_takes);
    w.header("weir_redis_data_errors_total", "counter",
             "Script calls failed by the data of one key (WRONGTYPE, a field that is not a number): that scope "
             "only, no outage.");
    w.sample("weir_redis_data_errors_total", "", s.key_errors);
    w.header("weir_redis_data_resets_total", "counter",
             "Keys of the shared limits found holding data Weir cannot use, reset (taken as missing).");
    w.sample("weir_redis_data_resets_total", "", s.key_resets);
    w.header("weir_redis_evicting", "gauge",
             "1 when Redis's maxmemory-policy evicts keys (anything but noeviction): keys, spend and buckets can "
             "vanish.");
    w.sample("weir_redis_evicting", "", static_cast<double>(s.evicting));
  }
  if (shared.redis_keys) {
    // Virtual keys in Redis: lookups of keys no worker had cached (atomics).
    const auto s = shared.redis_keys->stats();
    core::PromWriter w(out);
    w.header("weir_redis_key_lookups_total", "counter",
             "API key lookups in Redis by answer (found; refused = unknown, revoked or invalid; unavailable).");
    w.sample("weir_redis_key_lookups_total", "result=\"found\"", s.found);
    w.sample("weir_redis_key_lookups_total", "result=\"refused\"", s.not_found);
    w.sample("weir_redis_key_lookups_total", "result=\"unavailable\"", s.failures);
    w.header("weir_redis_key_commands_total", "counter", "HMGETs sent (lookups of one key in flight share one).");
    w.sample("weir_redis_key_commands_total", "", s.commands);
    w.header("weir_redis_key_stale_served_total", "counter",
             "Requests whose Redis key was served from an expired cache entry because Redis did not answer "
             "(redis.fail_open, auth.key_stale_ttl).");
    w.sample("weir_redis_key_stale_served_total", "", s.stale_served);
  }
  http::append_shortage_metrics(out);
  core::append_build_info(out);
  core::append_process_metrics(out, core::read_process_stats());
}

}  // namespace weir::gateway
