// Micro-benchmark of what the request-log store adds to the log phase on a
// worker: one record (a 600-byte access-log line and its indexed columns)
// copied into the worker's RecordQueue (requestlog/queue.hpp), in ns, with
// allocs_per_call in steady state (slots reused). The consumer pops inline,
// so this is the producer's cost without the writer thread. Run:
//   build/bin/weir-microbench --benchmark_filter='RequestLog'
#include <string>

#include <benchmark/benchmark.h>

#include "alloc_hook.hpp"
#include "requestlog/queue.hpp"

namespace {

using namespace weir;

void BM_RequestLog_Push(benchmark::State& state) {
  requestlog::RecordQueue q(4096);
  const std::string line(600, 'x');
  const std::string id = "0123456789abcdef0123", tenant = "acme", key = "acme-prod", model = "llama-3.1-8b";
  auto push = [&](std::int64_t i) {
    requestlog::Record* r = q.begin_push();
    if (!r) {
      q.drop();
      return;
    }
    r->ts_us = i;
    r->status = 200;
    r->request_id.assign(id);
    r->tenant.assign(tenant);
    r->key_id.assign(key);
    r->model.assign(model);
    r->json.assign(line);
    q.commit();
  };
  // Warm every slot once (their strings grow to size), as a running worker's are.
  for (int i = 0; i < 4096; ++i) {
    push(i);
    q.pop();
  }
  std::int64_t i = 0;
  const auto a0 = bench::allocations();
  for (auto _ : state) {
    push(++i);
    benchmark::DoNotOptimize(q.front());
    q.pop();
  }
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(bench::allocations() - a0), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_RequestLog_Push);

}  // namespace
