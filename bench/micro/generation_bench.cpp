// Micro-benchmark of what a configuration generation costs a request
// (gateway/generation.hpp): the read phase copies the worker's
// shared_ptr<WorkerGeneration> into the request and the log phase drops it
// (two uncontended atomic operations on one worker's thread), and every pool
// lookup goes through it. Run:
//   build/bin/weir-microbench --benchmark_filter='Generation'
#ifdef WEIR_MICROBENCH_AUTH
#include <benchmark/benchmark.h>

#include "alloc_hook.hpp"
#include "gateway/generation.hpp"

namespace {

using namespace weir;

void BM_Generation_HoldPerRequest(benchmark::State& state) {
  auto cfg = core::parse_config("pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2]}}\ndefault_pool: a\n",
                                "bench");
  auto g = gateway::build_generation({.config = std::make_shared<const core::Config>(std::move(*cfg))}, nullptr);
  auto worker_gen = std::make_shared<gateway::WorkerGeneration>();
  worker_gen->shared = *g;
  const auto& slot = (*g)->pools[0];
  worker_gen->pools.push_back(std::make_shared<routing::WorkerPool>(*slot.cfg, slot.addrs, slot.state.get()));
  worker_gen->batchers.emplace_back();
  std::shared_ptr<gateway::WorkerGeneration> request;  // RequestContext::gen
  const auto a0 = bench::allocations();
  for (auto _ : state) {
    request = worker_gen;  // read phase
    benchmark::DoNotOptimize(&request->pool(0));
    benchmark::DoNotOptimize(request->endpoint_slot(0, 1));
    request.reset();  // log phase
  }
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(bench::allocations() - a0), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_Generation_HoldPerRequest);

}  // namespace
#endif
