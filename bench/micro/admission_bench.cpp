// Micro-benchmarks of the admit phase and of the whole admission path
// (authenticate + model check + admit + settle), in ns per request.
// Counters: allocs_per_call (steady state). Run:
//   build/bin/weir-microbench --benchmark_filter='Admission'
// Compiled only when the binary links weir_admission (WEIR_MICROBENCH_AUTH).
#ifdef WEIR_MICROBENCH_AUTH
#include <thread>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "admission/admission.hpp"
#include "admission/local_limiter.hpp"
#include "alloc_hook.hpp"
#include "auth/authenticator.hpp"

namespace {

using namespace weir;

constexpr std::string_view kKey = "sk-weir-live-3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c";

// Limits high enough never to refuse, so every iteration runs the full admit.
std::shared_ptr<const auth::AuthPolicy> policy() {
  const std::string yaml = fmt::format(R"(
tenants:
  acme:
    models: [gpt-4o-mini, "meta-llama/*"]
    limits: {{requests_per_minute: 1000000000, tokens_per_minute: 1000000000000, max_concurrent_streams: 100000}}
    budget: {{usd: 1000000000}}
auth:
  api_keys:
    - id: acme-prod
      sha256: {}
      tenant: acme
      limits: {{requests_per_minute: 1000000000, tokens_per_minute: 1000000000000}}
)",
                                       auth::to_hex(auth::sha256(kKey)));
  return auth::AuthPolicy::build(*auth::parse_auth_config(YAML::Load(yaml)));
}

admission::Pricing pricing() {
  admission::Pricing p;
  p.set("gpt-4o-mini", admission::ModelPrice{150'000, 600'000, 75'000});
  return p;
}

void report_allocs(benchmark::State& state, std::uint64_t before) {
  state.counters["allocs_per_call"] =
      static_cast<double>(weir::bench::allocations() - before) / static_cast<double>(state.iterations());
}

// admit + settle for a key principal (tenant and key scopes: 2 RPM + 2 TPM
// buckets, a stream slot, a budget), one worker.
void BM_Admission_AdmitSettle(benchmark::State& state) {
  const auto pol = policy();
  const auto prices = pricing();
  admission::LocalLimiter limiter(pol->scopes(), static_cast<std::uint32_t>(state.range(0)),
                                  admission::MonoClock::now());
  admission::Admission adm(limiter, prices, 0);
  auth::Authenticator authn(pol, nullptr);
  auto principal = *authn.authenticate("", kKey, auth::WallClock::now());
  const api::Usage usage{400, 128, 528, 0};
  auto now = admission::MonoClock::now();
  const auto before = weir::bench::allocations();
  for (auto _ : state) {
    now += std::chrono::microseconds(1);
    auto t = adm.admit(*principal, "gpt-4o-mini", 528, now);
    benchmark::DoNotOptimize(t);
    adm.settle(*t, usage, now);
  }
  report_allocs(state, before);
  state.SetLabel(fmt::format("{} worker shards", state.range(0)));
}
BENCHMARK(BM_Admission_AdmitSettle)->Arg(1)->Arg(8);

// Only the rate-limit decision: one requests-bucket take on a shard.
void BM_Admission_BucketTake(benchmark::State& state) {
  const auto pol = policy();
  admission::LocalLimiter limiter(pol->scopes(), 1, admission::MonoClock::now());
  auto now = admission::MonoClock::now();
  for (auto _ : state) {
    now += std::chrono::microseconds(1);
    auto r = limiter.take(0, admission::Bucket::requests, 0, 1.0, now);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_Admission_BucketTake);

// The whole admission path of one request with an API key.
void BM_Admission_FullPathApiKey(benchmark::State& state) {
  const auto pol = policy();
  const auto prices = pricing();
  admission::LocalLimiter limiter(pol->scopes(), 1, admission::MonoClock::now());
  admission::Admission adm(limiter, prices, 0);
  auth::Authenticator authn(pol, nullptr);
  const std::string header = "Bearer " + std::string(kKey);
  const api::Usage usage{400, 128, 528, 0};
  const auto wall = auth::WallClock::now();
  auto now = admission::MonoClock::now();
  const auto before = weir::bench::allocations();
  for (auto _ : state) {
    now += std::chrono::microseconds(1);
    auto p = authn.authenticate(header, "", wall);
    auto m = auth::Authenticator::check_model(**p, "gpt-4o-mini");
    auto t = adm.admit(**p, "gpt-4o-mini", admission::TokenEstimate::of(1600, 128), now);
    auto h = adm.rate_limit_headers(**p, now);
    benchmark::DoNotOptimize(m);
    benchmark::DoNotOptimize(h);
    adm.settle(*t, usage, now);
  }
  report_allocs(state, before);
}
BENCHMARK(BM_Admission_FullPathApiKey);

// Two workers admitting for the same tenant at once (shared cache lines in
// the budget counter; own shards for the buckets).
void BM_Admission_AdmitSettleContended(benchmark::State& state) {
  static std::shared_ptr<const auth::AuthPolicy> pol;
  static std::unique_ptr<admission::LocalLimiter> limiter;
  static admission::Pricing prices = pricing();
  if (state.thread_index() == 0) {
    pol = policy();
    limiter = std::make_unique<admission::LocalLimiter>(pol->scopes(), static_cast<std::uint32_t>(state.threads()),
                                                        admission::MonoClock::now());
  }
  // Google Benchmark starts the timed loop of all threads together (after setup on thread 0).
  admission::Admission* adm = nullptr;
  auth::PrincipalPtr principal;
  const api::Usage usage{400, 128, 528, 0};
  auto now = admission::MonoClock::now();
  for (auto _ : state) {
    if (!adm) {
      state.PauseTiming();
      adm = new admission::Admission(*limiter, prices, static_cast<std::uint32_t>(state.thread_index()));
      auth::Authenticator authn(pol, nullptr);
      principal = *authn.authenticate("", kKey, auth::WallClock::now());
      state.ResumeTiming();
    }
    now += std::chrono::microseconds(1);
    auto t = adm->admit(*principal, "gpt-4o-mini", 528, now);
    benchmark::DoNotOptimize(t);
    adm->settle(*t, usage, now);
  }
  delete adm;
}
BENCHMARK(BM_Admission_AdmitSettleContended)->Threads(2)->UseRealTime();

}  // namespace
#endif  // WEIR_MICROBENCH_AUTH
