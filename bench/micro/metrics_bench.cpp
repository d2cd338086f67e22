// Micro-benchmarks of the metrics shard updates on the request path: the
// per-event ITL observation (respond_stream) and the log phase's per-request
// update with and without tenant/key_id labels (gateway/metrics.hpp), in ns,
// with allocs_per_call in steady state. Run:
//   build/bin/weir-microbench --benchmark_filter='Metrics'
#ifdef WEIR_MICROBENCH_AUTH
#include <array>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "alloc_hook.hpp"
#include "auth/config.hpp"
#include "core/config.hpp"
#include "gateway/metrics.hpp"

namespace {

using namespace weir;

// 4 models, 2 pools; 64 tenants with one key each when `auth`.
struct Setup {
  core::Config cfg;
  std::shared_ptr<const auth::AuthPolicy> policy;
  std::vector<auth::Principal> principals;
};

Setup setup(bool auth, bool key_ids) {
  Setup s;
  s.cfg = *core::parse_config(
      fmt::format("server: {{metrics: {{key_id_label: {}}}}}\n"
                  "pools: {{a: {{endpoints: [http://127.0.0.1:1, http://127.0.0.1:2]}}, "
                  "b: {{endpoints: [http://127.0.0.1:3]}}}}\n"
                  "models: {{m0: {{pool: a}}, m1: {{pool: a}}, m2: {{pool: b}}, m3: {{pool: b}}}}\n",
                  key_ids),
      "bench");
  if (!auth) return s;
  std::string yaml = "tenants:\n";
  for (int t = 0; t < 64; ++t) yaml += fmt::format("  t{:02}: {{}}\n", t);
  yaml += "auth:\n  api_keys:\n";
  for (int t = 0; t < 64; ++t)
    yaml += fmt::format("    - {{id: k{:02}, tenant: t{:02}, sha256: {:064x}}}\n", t, t, t + 1);
  s.policy = auth::AuthPolicy::build(*auth::parse_auth_config(YAML::Load(yaml)));
  for (const auto& k : s.policy->keys()) {
    auth::Principal p;
    p.kind = auth::CredentialKind::api_key;
    p.tenant = k.tenant;
    p.key = &k;
    s.principals.push_back(p);
  }
  return s;
}

void BM_Metrics_ItlObserve(benchmark::State& state) {
  core::Histogram h(core::itl_buckets_us());
  std::array<std::int64_t, 64> gaps{};
  for (std::size_t i = 0; i < gaps.size(); ++i) gaps[i] = static_cast<std::int64_t>(500 + (i * 7919) % 30'000);
  std::size_t i = 0;
  const auto a0 = bench::allocations();
  for (auto _ : state) {
    h.observe_us(gaps[i++ & 63]);
    benchmark::DoNotOptimize(h);
  }
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(bench::allocations() - a0), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_Metrics_ItlObserve);

// What the log phase does to the shard for one finished request.
void log_update(gateway::MetricsShard& m, const gateway::MetricLabels& labels, const auth::Principal* p,
                std::uint32_t model) {
  const auto id = labels.identity(p);
  m.count_request(gateway::RouteKind::chat_completions, model, 200, id);
  m.add_spend(model, 22'000, id);
  m.duration(model).observe_us(748'602);
  m.observe_ttft(model, 90'523, id);
  m.upstream_time(model).observe_us(748'383);
  m.added().observe_us(141);
  m.add_tokens(model, 8, 48, id);
}

void BM_Metrics_LogUpdate(benchmark::State& state) {
  const bool auth = state.range(0) > 0, key_ids = state.range(0) > 1;
  const auto s = setup(auth, key_ids);
  const auto labels = gateway::MetricLabels::build(s.cfg, s.policy.get());
  gateway::MetricsShard m(labels);
  // Every series once first: the steady state a running gateway is in.
  for (std::size_t p = 0; p < std::max<std::size_t>(s.principals.size(), 1); ++p)
    for (std::uint32_t model = 0; model < 4; ++model) log_update(m, *labels, auth ? &s.principals[p] : nullptr, model);
  std::size_t i = 0;
  const auto a0 = bench::allocations();
  for (auto _ : state) {
    const auth::Principal* p = auth ? &s.principals[i % s.principals.size()] : nullptr;
    log_update(m, *labels, p, static_cast<std::uint32_t>(i & 3));
    ++i;
  }
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(bench::allocations() - a0), benchmark::Counter::kAvgIterations);
}
// 0: no auth (no identity labels); 1: 64 tenants labelled; 2: and 64 key ids.
BENCHMARK(BM_Metrics_LogUpdate)->Arg(0)->Arg(1)->Arg(2);

}  // namespace
#endif
