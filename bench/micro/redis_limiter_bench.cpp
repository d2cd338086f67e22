// Micro-benchmarks of RedisLimiter's request path: a take from the local
// lease (what a worker does per bucket per request) and the whole admit +
// settle through Admission, in ns. No Redis is contacted: the limiter is
// built but not started, and its leases are primed through the public API
// (give_back / release_stream add units to a lease), so what is measured is
// exactly the worker-side code that runs when a lease has units.
// Run: build/bin/weir-microbench --benchmark_filter='RedisLimiter'
#ifdef WEIR_MICROBENCH_AUTH
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <boost/asio/io_context.hpp>

#include "admission/admission.hpp"
#include "admission/redis_limiter.hpp"
#include "alloc_hook.hpp"
#include "auth/authenticator.hpp"

namespace {

using namespace weir;

constexpr std::string_view kKey = "sk-weir-live-3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c";

std::shared_ptr<const auth::AuthPolicy> policy() {
  const std::string yaml = fmt::format(R"(
tenants:
  acme:
    models: [gpt-4o-mini]
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

admission::RedisConfig config() {
  admission::RedisConfig c;
  c.port = 1;  // never contacted: start() is not called
  return c;
}

// Fills every lease and stream allowance far beyond what a run consumes.
void prime(admission::RedisLimiter& l, std::size_t scopes) {
  const auto now = admission::MonoClock::now();
  for (std::uint32_t s = 0; s < scopes; ++s) {
    l.give_back(s, admission::Bucket::requests, 0, 1e15, now);
    l.give_back(s, admission::Bucket::tokens, 0, 1e15, now);
    for (int i = 0; i < 1000; ++i) l.release_stream(s, 0);
  }
}

// One take of one request from the lease: the per-bucket cost of admission.
void BM_RedisLimiter_LeaseTake(benchmark::State& state) {
  static std::shared_ptr<const auth::AuthPolicy> pol;
  static std::unique_ptr<boost::asio::io_context> ioc;
  static std::unique_ptr<admission::RedisLimiter> limiter;
  if (state.thread_index() == 0) {
    pol = policy();
    ioc = std::make_unique<boost::asio::io_context>();
    limiter =
        std::make_unique<admission::RedisLimiter>(*ioc, pol->scopes(), static_cast<std::uint32_t>(state.threads()),
                                                  config(), admission::MonoClock::now(), [](std::string_view) {});
    prime(*limiter, pol->scopes().size());
  }
  const auto w = static_cast<std::uint32_t>(state.thread_index());
  auto now = admission::MonoClock::now();
  for (auto _ : state) {
    now += std::chrono::microseconds(1);
    auto r = limiter->take(0, admission::Bucket::requests, w, 1.0, now);
    benchmark::DoNotOptimize(r);
  }
  if (state.thread_index() == 0) state.SetLabel(fmt::format("{} thread(s), one tenant", state.threads()));
}
BENCHMARK(BM_RedisLimiter_LeaseTake);
BENCHMARK(BM_RedisLimiter_LeaseTake)->Threads(2)->UseRealTime();

// admit + settle for an API-key principal (tenant + key scopes: 2 RPM and 2
// TPM leases, a stream slot, a budget), like BM_Admission_AdmitSettle with
// the in-process LocalLimiter.
void BM_RedisLimiter_AdmitSettle(benchmark::State& state) {
  const auto pol = policy();
  admission::Pricing prices;
  prices.set("gpt-4o-mini", admission::ModelPrice{150'000, 600'000, 75'000});
  boost::asio::io_context ioc;
  admission::RedisLimiter limiter(ioc, pol->scopes(), 1, config(), admission::MonoClock::now(),
                                  [](std::string_view) {});
  prime(limiter, pol->scopes().size());
  admission::Admission adm(limiter, prices, 0);
  auth::Authenticator authn(pol, nullptr);
  auto principal = *authn.authenticate("", kKey, auth::WallClock::now());
  const api::Usage usage{400, 128, 528, 0};
  auto now = admission::MonoClock::now();
  const auto before = weir::bench::allocations();
  for (auto _ : state) {
    now += std::chrono::microseconds(1);
    admission::Shortfall wait;
    auto t = adm.admit(*principal, "gpt-4o-mini", 528, now, &wait);
    benchmark::DoNotOptimize(t);
    adm.settle(*t, usage, now);
  }
  state.counters["allocs_per_call"] =
      static_cast<double>(weir::bench::allocations() - before) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_RedisLimiter_AdmitSettle);

}  // namespace
#endif  // WEIR_MICROBENCH_AUTH
