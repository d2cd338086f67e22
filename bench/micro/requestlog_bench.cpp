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
#include "requestlog/redact.hpp"

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

// Body capture (request_log.capture_bodies), per captured request: the
// request body's first 16 KiB copied and searched for the request's own
// credential (what GatewayPhases::begin_capture does on the worker); the
// pattern redaction runs on the writer thread (BM_RequestLog_RedactPatterns).
void BM_RequestLog_CaptureRequestBody(benchmark::State& state) {
  std::string body = R"({"model":"llama","messages":[{"role":"user","content":")";
  body.append(static_cast<std::size_t>(state.range(0)), 'w');
  body += R"("}]})";
  const std::string key = "sk-weir-Zx81kQ0pLm4Tn7Wc2Ve5aB3dE6fG9hJ1";
  std::string captured;
  captured.reserve(16 * 1024);
  const auto a0 = bench::allocations();
  for (auto _ : state) {
    captured.clear();
    captured.append(std::string_view(body).substr(0, 16 * 1024));
    requestlog::redact_exact(captured, key, body.size() > 16 * 1024);
    benchmark::DoNotOptimize(captured.data());
  }
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(bench::allocations() - a0), benchmark::Counter::kAvgIterations);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(std::min<std::size_t>(body.size(), 16 * 1024)));
}
BENCHMARK(BM_RequestLog_CaptureRequestBody)->Arg(1600)->Arg(16000);

void BM_RequestLog_RedactPatterns(benchmark::State& state) {
  std::string body = R"({"model":"llama","messages":[{"role":"user","content":")";
  for (int i = 0; i < 200; ++i) body += "the quick brown fox jumps over the lazy dog ";
  body += R"("}],"user":"u-1"})";
  std::string text;
  for (auto _ : state) {
    text = body;
    requestlog::redact_patterns(text, false);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(body.size()));
}
BENCHMARK(BM_RequestLog_RedactPatterns);

}  // namespace
