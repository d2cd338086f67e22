// Tracing's cost on the request path (tracing:, docs/observability.md#traces):
//   - per request, tracing on: the caller's traceparent parsed (or a new
//     trace id made), the sampling decision, a span id and traceparent per
//     upstream attempt;
//   - per sampled request: its spans copied into the worker's queue slot
//     (gateway::fill_trace_record, the function the log phase calls), with
//     the consumer popping as the exporter does.
// Nothing happens per SSE event: the stream's span is the request's
// timestamps and counters.
//   build/bin/weir-microbench --benchmark_filter='Tracing'
#include <benchmark/benchmark.h>

#include "alloc_hook.hpp"
#include "core/config.hpp"
#include "gateway/context.hpp"
#include "gateway/phases.hpp"
#include "tracing/context.hpp"
#include "tracing/record.hpp"

namespace {

using namespace weir;

void BM_Tracing_BeginAndPropagate(benchmark::State& state) {
  tracing::IdGenerator ids(1);
  const tracing::Sampler sampler(0.1);
  const bool with_parent = state.range(0) != 0;
  const std::string traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const std::string tracestate = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
  gateway::TraceState t;
  const auto a0 = bench::allocations();
  for (auto _ : state) {
    t.reset();
    t.on = true;
    if (with_parent) {
      auto p = tracing::parse_traceparent(traceparent);
      t.trace_id = p->trace_id;
      t.parent_id = p->span_id;
      t.sampled = p->sampled();
      tracing::normalize_tracestate(tracestate, t.tracestate);
    } else {
      t.trace_id = ids.trace_id();
      t.sampled = sampler.root_sampled(t.trace_id);
    }
    t.span_id = ids.span_id();
    t.attempt_span = ids.span_id();  // one upstream attempt
    tracing::format_traceparent(t.traceparent, t.trace_id, t.attempt_span, t.sampled);
    benchmark::DoNotOptimize(t.traceparent);
  }
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(bench::allocations() - a0), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_Tracing_BeginAndPropagate)->Arg(0)->Arg(1)->ArgNames({"parent"});

void BM_Tracing_RecordSampledRequest(benchmark::State& state) {
  auto cfg = core::parse_config(
      "pools: {gpu: {endpoints: ['http://10.0.0.1:8000', 'http://10.0.0.2:8000']}}\n"
      "models: {llama: {pool: gpu}}\n",
      "bench.yaml");
  if (!cfg) {
    state.SkipWithError("config");
    return;
  }
  tracing::IdGenerator ids(2);
  tracing::TraceQueue q(4096);
  // A streamed chat completion that authenticated, was admitted, retried once and streamed 128 tokens.
  gateway::RequestContext ctx;
  const auto t0 = core::now();
  ctx.t_start = t0;
  ctx.request_id = "f2ff72cd010000000002";
  ctx.method = "POST";
  ctx.path = "/v1/chat/completions";
  ctx.route = gateway::RouteKind::chat_completions;
  ctx.model = "meta-llama/Llama-3.1-8B-Instruct";
  ctx.stream = true;
  ctx.status = 200;
  ctx.has_usage = true;
  ctx.usage.prompt_tokens = 400;
  ctx.usage.completion_tokens = 128;
  ctx.events = 130;
  ctx.t_first_byte = t0 + std::chrono::milliseconds(90);
  ctx.t_first_token = t0 + std::chrono::milliseconds(91);
  ctx.t_upstream_sent = t0 + std::chrono::microseconds(150);
  ctx.t_upstream_done = t0 + std::chrono::milliseconds(1900);
  ctx.trace = std::make_unique<gateway::TraceState>();
  auto& t = *ctx.trace;
  t.on = t.sampled = true;
  t.trace_id = ids.trace_id();
  t.span_id = ids.span_id();
  t.parent_id = ids.span_id();
  t.tracestate = "congo=t61rcWkgMzE";
  t.user_agent = "OpenAI/Python 1.50.0";
  t.auth_span = t.admit_span = true;
  t.auth_start = t0 + std::chrono::microseconds(10);
  t.auth_end = t0 + std::chrono::microseconds(20);
  t.admit_start = t0 + std::chrono::microseconds(30);
  t.admit_end = t0 + std::chrono::microseconds(40);
  t.attempt_span = ids.span_id();
  ctx.record_attempt({.pool = 0, .endpoint = 0, .failure = http::UpstreamFailure::connect_refused, .us = 100});
  t.attempt_span = ids.span_id();
  ctx.record_attempt({.pool = 0, .endpoint = 1, .status = 200, .us = 89'000});
  const auto end = t0 + std::chrono::milliseconds(1901);
  const auto wall = std::chrono::system_clock::now();
  auto push = [&] {
    tracing::TraceRecord* r = q.begin_push();
    if (!r) {
      q.drop(gateway::trace_span_count(ctx));
      return;
    }
    gateway::fill_trace_record(*r, ctx, *cfg, ids, end, wall, 14'000);
    q.commit();
  };
  // Warm every slot once (their strings grow to size), as a running worker's are.
  for (int i = 0; i < 4096; ++i) {
    push();
    q.pop();
  }
  const auto a0 = bench::allocations();
  for (auto _ : state) {
    push();
    benchmark::DoNotOptimize(q.front());
    q.pop();
  }
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(bench::allocations() - a0), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_Tracing_RecordSampledRequest);

}  // namespace
