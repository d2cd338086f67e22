// json_scan and extract_usage cost per call on a seed-sized chat request
// (~2 KB: a system and a user message making a ~400-token prompt, sampling
// parameters, stream options), with "model" first and with it last. The scan
// always walks the whole top-level object (last duplicate wins), so the two
// differ only in where the match is. Counter: allocs_per_call (steady state,
// `out` reused). For scale, the same edit through a full Boost.JSON parse and
// serialize.
#include <benchmark/benchmark.h>

#include <boost/json.hpp>

#include <string>
#include <string_view>

#include "alloc_hook.hpp"
#include "api/json_scan.hpp"
#include "api/usage.hpp"

namespace {

using namespace weir::api;

constexpr std::string_view kModel = R"("model":"meta-llama/Llama-3.1-8B-Instruct")";

std::string messages() {
  std::string user;
  static constexpr std::string_view kLine =
      R"(Summarize the following ticket for the on-call engineer.\nThe customer says: \"the dashboard shows café prices twice\" and attached logs. )";
  while (user.size() < 1500) user += kLine;
  return std::string(
             R"("messages":[{"role":"system","content":"You are a concise, careful assistant. Answer in plain text; quote exact error strings."},{"role":"user","content":")") +
         user + R"("}])";
}

constexpr std::string_view kParams =
    R"("temperature":0.7,"top_p":0.95,"max_tokens":128,"stream":true,"stream_options":{"include_usage":true},"user":"tenant-42")";

std::string body_model_first() {
  return "{" + std::string(kModel) + "," + messages() + "," + std::string(kParams) + "}";
}
std::string body_model_last() {
  return "{" + messages() + "," + std::string(kParams) + "," + std::string(kModel) + "}";
}

void report(benchmark::State& state, std::size_t bytes, std::uint64_t allocs_before) {
  state.counters["allocs_per_call"] =
      static_cast<double>(weir::bench::allocations() - allocs_before) / static_cast<double>(state.iterations());
  state.counters["body_bytes"] = static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

template <std::string (*Body)()>
void BM_FindMember(benchmark::State& state) {
  const std::string body = Body();
  const std::uint64_t a = weir::bench::allocations();
  for (auto _ : state) benchmark::DoNotOptimize(find_member(body, "model"));
  report(state, body.size(), a);
}

template <std::string (*Body)()>
void BM_SetMemberReplace(benchmark::State& state) {
  const std::string body = Body();
  std::string out;
  set_member(body, "model", R"("llama-3.1-8b")", out);  // warm-up: out reaches its size
  const std::uint64_t a = weir::bench::allocations();
  for (auto _ : state) {
    benchmark::DoNotOptimize(set_member(body, "model", R"("llama-3.1-8b")", out));
    benchmark::DoNotOptimize(out.data());
  }
  report(state, body.size(), a);
}

void BM_SetMemberInsert(benchmark::State& state) {
  const std::string body = body_model_first();
  std::string out;
  set_member(body, "seed", "1234", out);
  const std::uint64_t a = weir::bench::allocations();
  for (auto _ : state) {
    benchmark::DoNotOptimize(set_member(body, "seed", "1234", out));
    benchmark::DoNotOptimize(out.data());
  }
  report(state, body.size(), a);
}

void BM_RemoveMember(benchmark::State& state) {
  const std::string body = body_model_first();
  std::string out;
  remove_member(body, "stream_options", out);
  const std::uint64_t a = weir::bench::allocations();
  for (auto _ : state) {
    benchmark::DoNotOptimize(remove_member(body, "stream_options", out));
    benchmark::DoNotOptimize(out.data());
  }
  report(state, body.size(), a);
}

// The same model rewrite done the usual way: parse, assign, serialize.
void BM_BoostJsonParseSetSerialize(benchmark::State& state) {
  const std::string body = body_model_first();
  const std::uint64_t a = weir::bench::allocations();
  for (auto _ : state) {
    boost::json::value v = boost::json::parse(body);
    v.as_object()["model"] = "llama-3.1-8b";
    benchmark::DoNotOptimize(boost::json::serialize(v));
  }
  report(state, body.size(), a);
}

constexpr std::string_view kUsageChunk =
    R"({"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":400,"total_tokens":528,"completion_tokens":128}})";
constexpr std::string_view kContentChunk =
    R"({"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" café"},"logprobs":null,"finish_reason":null}]})";

void BM_ExtractUsage(benchmark::State& state, std::string_view chunk) {
  const std::uint64_t a = weir::bench::allocations();
  for (auto _ : state) benchmark::DoNotOptimize(extract_usage(chunk));
  report(state, chunk.size(), a);
}

BENCHMARK_TEMPLATE(BM_FindMember, body_model_first)->Name("BM_FindMember/model_first");
BENCHMARK_TEMPLATE(BM_FindMember, body_model_last)->Name("BM_FindMember/model_last");
BENCHMARK_TEMPLATE(BM_SetMemberReplace, body_model_first)->Name("BM_SetMemberReplace/model_first");
BENCHMARK_TEMPLATE(BM_SetMemberReplace, body_model_last)->Name("BM_SetMemberReplace/model_last");
BENCHMARK(BM_SetMemberInsert);
BENCHMARK(BM_RemoveMember);
BENCHMARK(BM_BoostJsonParseSetSerialize);
BENCHMARK_CAPTURE(BM_ExtractUsage, usage_chunk, kUsageChunk);
BENCHMARK_CAPTURE(BM_ExtractUsage, content_chunk_no_usage, kContentChunk);

}  // namespace
