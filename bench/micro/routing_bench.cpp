// WorkerPool::pick per policy, four endpoints: what the endpoint choice
// costs a request. p2c is the default and must cost what it did before the
// policy seam; prefix_affinity hashes and looks up a 4,000-byte prompt (63
// blocks) and records the choice in the shared index.
// Counters: ns_per_pick (allocs_per_pick via alloc_hook).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "alloc_hook.hpp"
#include "routing/pool.hpp"

namespace {

using namespace weir;

core::Config config(std::string_view extra) {
  auto c = core::parse_config(
      fmt::format("pools: {{a: {{endpoints: [http://127.0.0.1:1, http://127.0.0.1:2, http://127.0.0.1:3, "
                  "http://127.0.0.1:4]{}}}}}\ndefault_pool: a\n",
                  extra),
      "bench");
  return std::move(*c);
}

void run(benchmark::State& state, std::string_view extra, const routing::PickRequest& req) {
  const auto cfg = config(extra);
  routing::SharedPoolState shared(cfg.pools[0]);
  std::vector<http::tcp::endpoint> addrs(4);
  routing::WorkerPool pool(cfg.pools[0], addrs, &shared);
  routing::Rng rng(42);
  for (std::uint32_t i = 0; i < 4; ++i)
    for (std::uint32_t k = 0; k < i; ++k) pool.on_start(i);
  const auto now = std::chrono::steady_clock::now();
  std::uint64_t sum = pool.pick(now, rng, routing::WorkerPool::npos, req);  // warm: the prefix is indexed
  const auto allocs0 = weir::bench::allocations();
  for (auto _ : state) sum += pool.pick(now, rng, routing::WorkerPool::npos, req);
  benchmark::DoNotOptimize(sum);
  state.counters["ns_per_pick"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["allocs_per_pick"] =
      static_cast<double>(weir::bench::allocations() - allocs0) / static_cast<double>(state.iterations());
}

std::string prompt4k() {
  std::string s = R"([{"role":"system","content":")";
  for (int i = 0; s.size() < 4000; ++i) s += fmt::format("word{} ", i);
  s += R"("},{"role":"user","content":"what now?"}])";
  return s;
}

void BM_PickP2c(benchmark::State& s) { run(s, "", {}); }
void BM_PickLeastLoad(benchmark::State& s) { run(s, ", balance: least_load", {}); }
void BM_PickPrefixAffinity4k(benchmark::State& s) {
  const std::string p = prompt4k();
  run(s, ", balance: prefix_affinity", {.model = "m", .prompt = p});
}
void BM_PickSession(benchmark::State& s) {
  run(s, ", session_header: x-session-id", {.session = "3f9c0b6e-2d4a-4c1f-9e8b-7a6d5c4b3a29"});
}
BENCHMARK(BM_PickP2c);
BENCHMARK(BM_PickLeastLoad);
BENCHMARK(BM_PickPrefixAffinity4k);
BENCHMARK(BM_PickSession);

}  // namespace
