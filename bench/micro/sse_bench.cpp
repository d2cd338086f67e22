// SseReader cost per event on a realistic vLLM chat stream: role chunk, 128
// content chunks (ASCII, multi-byte UTF-8, escapes), finish chunk, usage chunk
// and [DONE], as vLLM writes them (LF endings, ~240 bytes per chunk).
//
// Shapes of the input:
//   OnePushPerEvent  each event arrives in its own read (vLLM flushes per token)
//   WholeStream      all 132 events in one buffer (best case)
//   Tcp1460          1460-byte segments cut across events (loaded server)
//   OneBytePushes    one byte per push (worst case)
// Counters: ns_per_event, allocs_per_event (steady state, after one warm-up pass).
#include <benchmark/benchmark.h>

#include <boost/json/parse.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "alloc_hook.hpp"
#include "http/sse.hpp"

namespace {

using weir::http::SseReader;

std::string chunk(std::string_view delta, std::string_view finish = "null") {
  std::string s =
      R"(data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":)";
  s += delta;
  s += R"(,"logprobs":null,"finish_reason":)";
  s += finish;
  s += "}]}\n\n";
  return s;
}

// The events of one 128-token completion.
std::vector<std::string> vllm_events() {
  static constexpr std::string_view kTokens[] = {
      "The", " quick",         " brown", " fox",   " café", " 日本", "語",   " 😀", R"( \"quoted\")",
      "\\n", " back\\\\slash", ",",      " jumps", " over", " the",  " lazy"};
  std::vector<std::string> ev;
  ev.push_back(chunk(R"({"role":"assistant","content":""})"));
  for (int i = 0; i < 128; ++i) {
    ev.push_back(chunk(std::string(R"({"content":")") + std::string(kTokens[i % std::size(kTokens)]) + "\"}"));
  }
  ev.push_back(chunk(R"({"content":""})", R"("stop","stop_reason":null)"));
  ev.push_back(
      R"(data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":400,"total_tokens":528,"completion_tokens":128}})"
      "\n\n");
  ev.push_back("data: [DONE]\n\n");
  return ev;
}

std::vector<std::string> cut(const std::vector<std::string>& events, std::size_t size) {
  std::string all;
  for (const auto& e : events) all += e;
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < all.size(); i += size) pieces.push_back(all.substr(i, size));
  return pieces;
}

std::vector<std::string> whole(const std::vector<std::string>& events) {
  std::string all;
  for (const auto& e : events) all += e;
  return {all};
}

// Pushes `pieces` through `reader` once; returns the events read.
std::size_t drive(SseReader& reader, const std::vector<std::string>& pieces) {
  std::size_t events = 0;
  for (const std::string& p : pieces) {
    reader.push(p);
    while (auto ev = reader.next()) {
      benchmark::DoNotOptimize(ev->data.data());
      ++events;
    }
  }
  return events;
}

void run(benchmark::State& state, const std::vector<std::string>& pieces) {
  SseReader reader;
  const std::size_t events = drive(reader, pieces);  // warm-up: buffers reach their size
  std::size_t bytes = 0;
  for (const auto& p : pieces) bytes += p.size();
  const std::uint64_t allocs_before = weir::bench::allocations();
  for (auto _ : state) {
    benchmark::DoNotOptimize(drive(reader, pieces));
  }
  const std::uint64_t allocs = weir::bench::allocations() - allocs_before;
  const double total_events = static_cast<double>(events) * static_cast<double>(state.iterations());
  state.counters["ns_per_event"] = benchmark::Counter(
      static_cast<double>(events), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["allocs_per_event"] = static_cast<double>(allocs) / total_events;
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.SetItemsProcessed(static_cast<std::int64_t>(events) * state.iterations());
}

void BM_SseOnePushPerEvent(benchmark::State& state) { run(state, vllm_events()); }
void BM_SseWholeStream(benchmark::State& state) { run(state, whole(vllm_events())); }
void BM_SseTcp1460(benchmark::State& state) { run(state, cut(vllm_events(), 1460)); }
void BM_SseOneBytePushes(benchmark::State& state) { run(state, cut(vllm_events(), 1)); }

// For scale: what a full Boost.JSON parse of each chunk's data would cost,
// which the gateway avoids on the pass-through path.
void BM_BoostJsonParsePerEvent(benchmark::State& state) {
  std::vector<std::string> data;
  for (const auto& e : vllm_events()) {
    if (e != "data: [DONE]\n\n") data.push_back(e.substr(6, e.size() - 8));
  }
  for (auto _ : state) {
    for (const auto& d : data) benchmark::DoNotOptimize(boost::json::parse(d));
  }
  state.counters["ns_per_event"] = benchmark::Counter(
      static_cast<double>(data.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The relay's UTF-8 check of each event (http::replace_invalid_utf8, respond_stream.cpp: the events of a read
// that held a non-ASCII byte; an all-ASCII read passes on one scan of its bytes): the reader's
// cost plus the check, on the same whole stream as BM_SseWholeStream (the difference is the check's cost
// per event), and on one whose every content token has an ill-formed byte (each event repaired into the
// reused buffers). allocs_per_event must be 0 for both (the repair's buffers grew in the warm-up).
void run_checked(benchmark::State& state, const std::vector<std::string>& pieces) {
  SseReader reader;
  weir::http::Utf8Repair repair;
  std::size_t replaced = 0;
  auto pass = [&] {
    std::size_t events = 0;
    for (const std::string& p : pieces) {
      reader.push(p);
      while (auto ev = reader.next()) {
        replaced += weir::http::replace_invalid_utf8(*ev, repair);
        benchmark::DoNotOptimize(ev->data.data());
        ++events;
      }
    }
    return events;
  };
  const std::size_t events = pass();  // warm-up: buffers reach their size
  const std::uint64_t allocs_before = weir::bench::allocations();
  for (auto _ : state) benchmark::DoNotOptimize(pass());
  const std::uint64_t allocs = weir::bench::allocations() - allocs_before;
  const double total_events = static_cast<double>(events) * static_cast<double>(state.iterations());
  state.counters["ns_per_event"] = benchmark::Counter(
      static_cast<double>(events), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["allocs_per_event"] = static_cast<double>(allocs) / total_events;
  state.counters["replaced_per_event"] = static_cast<double>(replaced) / (total_events + static_cast<double>(events));
}

std::vector<std::string> ill_formed_events() {
  std::vector<std::string> ev = vllm_events();
  for (auto& e : ev)
    if (const auto at = e.find(R"("content":")"); at != std::string::npos) e.insert(at + 11, "\xFF");
  return ev;
}

void BM_SseWholeStreamUtf8Checked(benchmark::State& state) { run_checked(state, whole(vllm_events())); }
void BM_SseWholeStreamUtf8Repaired(benchmark::State& state) { run_checked(state, whole(ill_formed_events())); }

BENCHMARK(BM_SseOnePushPerEvent);
BENCHMARK(BM_SseWholeStream);
BENCHMARK(BM_SseTcp1460);
BENCHMARK(BM_SseOneBytePushes);
BENCHMARK(BM_BoostJsonParsePerEvent);
BENCHMARK(BM_SseWholeStreamUtf8Checked);
BENCHMARK(BM_SseWholeStreamUtf8Repaired);

}  // namespace
