// The stream translators' cost per upstream SSE event, on a 128-token
// stream (the events already framed by SseReader, whose cost sse_bench.cpp
// measures): each translator is reset and fed one whole stream per
// iteration, as a gateway does per request.
//
//   OpenAiToAnthropic   vLLM chunks → Anthropic Messages events (/v1/messages, OpenAI upstream)
//   OpenAiToResponses   vLLM chunks → OpenAI Responses events (/v1/responses, OpenAI upstream)
//   AnthropicToChat     Anthropic events → chat.completion.chunk (type: anthropic pools)
//   AnthropicPassthrough  reading an Anthropic stream's usage as it passes (/v1/messages, Anthropic upstream)
// Counters: ns_per_event (upstream events), allocs_per_event (steady state,
// after one warm-up stream: a stream's per-request buffers included).
#include <benchmark/benchmark.h>

#include <string>
#include <string_view>
#include <vector>

#include "alloc_hook.hpp"
#include "api/anthropic/stream.hpp"
#include "api/anthropic/upstream_stream.hpp"
#include "api/responses/stream.hpp"

namespace {

constexpr std::string_view kTokens[] = {"The", " quick", " brown",          " fox", " café",  " 日本",
                                        "語",  " 😀",     " \\\"quoted\\\"", "\\n",  " jumps", " over"};

std::vector<std::string> vllm_stream() {
  auto chunk = [](std::string_view delta, std::string_view finish = "null") {
    return std::string(
               R"({"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":)") +
           std::string(delta) + R"(,"logprobs":null,"finish_reason":)" + std::string(finish) + "}]}";
  };
  std::vector<std::string> ev{chunk(R"({"role":"assistant","content":""})")};
  for (int i = 0; i < 128; ++i)
    ev.push_back(chunk(std::string(R"({"content":")") + std::string(kTokens[i % std::size(kTokens)]) + "\"}"));
  ev.push_back(chunk(R"({"content":""})", R"("stop","stop_reason":null)"));
  ev.push_back(
      R"({"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":400,"total_tokens":528,"completion_tokens":128}})");
  ev.push_back("[DONE]");
  return ev;
}

std::vector<std::string> anthropic_stream() {
  std::vector<std::string> ev{
      R"({"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":400,"cache_read_input_tokens":0,"output_tokens":1}}})",
      R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})", R"({"type": "ping"})"};
  for (int i = 0; i < 128; ++i)
    ev.push_back(std::string(R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":")") +
                 std::string(kTokens[i % std::size(kTokens)]) + "\"}}");
  ev.push_back(R"({"type":"content_block_stop","index":0})");
  ev.push_back(
      R"({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":128}})");
  ev.push_back(R"({"type":"message_stop"})");
  return ev;
}

struct Discard final : weir::api::anthropic::ChunkSink {
  void chunk(std::string_view data) override {
    benchmark::DoNotOptimize(data.data());
    ++n;
  }
  std::size_t n = 0;
};

template <class Feed>
void run(benchmark::State& state, const std::vector<std::string>& events, Feed feed) {
  feed(events);  // warm-up: buffers reach their size
  const std::uint64_t before = weir::bench::allocations();
  for (auto _ : state) feed(events);
  const double total = static_cast<double>(events.size()) * static_cast<double>(state.iterations());
  state.counters["ns_per_event"] = benchmark::Counter(
      static_cast<double>(events.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["allocs_per_event"] = static_cast<double>(weir::bench::allocations() - before) / total;
}

void BM_TranslateOpenAiToAnthropic(benchmark::State& state) {
  weir::api::anthropic::StreamTranslator t;
  std::string out;
  run(state, vllm_stream(), [&](const std::vector<std::string>& ev) {
    t.reset();
    for (const auto& e : ev) {
      out.clear();
      t.on_data(e, out);
      benchmark::DoNotOptimize(out.data());
    }
  });
}

void BM_TranslateOpenAiToResponses(benchmark::State& state) {
  weir::api::responses::StreamTranslator t;
  std::string out;
  const std::string echo = R"("store":false,"tools":[])";
  run(state, vllm_stream(), [&](const std::vector<std::string>& ev) {
    t.reset(echo, "req-1", "m");
    for (const auto& e : ev) {
      out.clear();
      t.on_data(e, out);
      benchmark::DoNotOptimize(out.data());
    }
  });
}

void BM_TranslateAnthropicToChat(benchmark::State& state) {
  weir::api::anthropic::UpstreamStreamTranslator t;
  Discard sink;
  run(state, anthropic_stream(), [&](const std::vector<std::string>& ev) {
    t.reset(true, 1718035200);
    for (const auto& e : ev) t.on_data(e, sink);
  });
}

void BM_TranslateAnthropicPassthrough(benchmark::State& state) {
  weir::api::anthropic::PassthroughObserver o;
  run(state, anthropic_stream(), [&](const std::vector<std::string>& ev) {
    o.reset();
    for (const auto& e : ev) o.on_data(e);
    benchmark::DoNotOptimize(o.usage());
  });
}

BENCHMARK(BM_TranslateOpenAiToAnthropic);
BENCHMARK(BM_TranslateOpenAiToResponses);
BENCHMARK(BM_TranslateAnthropicToChat);
BENCHMARK(BM_TranslateAnthropicPassthrough);

}  // namespace
