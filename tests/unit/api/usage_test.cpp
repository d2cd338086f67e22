// extract_usage on vLLM/OpenAI bodies and stream chunks, nulls, and values
// that are not counts.
#include "api/usage.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <tuple>

namespace weir::api {
namespace {

using Counts = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;

// prompt, completion, total, cached
Counts counts(const Usage& u) { return {u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_tokens}; }
// A partial usage's counts (no total: 0).
Counts counts(const PartialUsage::Counts& c) { return {c.prompt_tokens, c.completion_tokens, 0, c.cached_tokens}; }

struct UsageCase {
  std::string_view name;
  std::string_view json;
  std::optional<Usage> want;
  bool invalid = false;  // a usage was sent that cannot be billed as sent (extract_usage's `invalid`)
  UsageRoute route = UsageRoute::generation;
};

void PrintTo(const UsageCase& c, std::ostream* os) { *os << c.name; }

class ApiExtractUsage : public ::testing::TestWithParam<UsageCase> {};

TEST_P(ApiExtractUsage, Table) {
  const UsageCase& c = GetParam();
  bool invalid = false;
  const auto got = extract_usage(c.json, &invalid, c.route);
  ASSERT_EQ(got.has_value(), c.want.has_value()) << c.json;
  EXPECT_EQ(invalid, c.invalid) << c.json;
  if (got) {
    EXPECT_EQ(counts(*got), counts(*c.want));
  }
}

const UsageCase kCases[] = {
    // vLLM's rerank answer: total_tokens only, all of it prompt.
    {"vllm_rerank_total_only", R"({"id":"rerank-1","model":"m","usage":{"total_tokens":7},"results":[]})",
     Usage{7, 0, 7, 0}, false, UsageRoute::pooling},
    // vLLM's embeddings answer: no completion.
    {"vllm_embeddings", R"({"object":"list","data":[],"usage":{"prompt_tokens":8,"total_tokens":8}})",
     Usage{8, 0, 8, 0}, false, UsageRoute::pooling},
    // vLLM's final chunk with stream_options.include_usage (field order as vLLM writes it).
    {"vllm_stream_usage_chunk",
     R"({"id":"chatcmpl-3f9c","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":400,"total_tokens":528,"completion_tokens":128}})",
     Usage{400, 128, 528, 0}},
    {"vllm_content_chunk_without_usage",
     R"({"id":"chatcmpl-3f9c","object":"chat.completion.chunk","created":1718035200,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"logprobs":null,"finish_reason":null}]})",
     std::nullopt},
    // continuous_usage_stats puts usage on every chunk, after the choices.
    {"vllm_continuous_usage",
     R"({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"{\"usage\":1}"}}],"usage":{"prompt_tokens":400,"total_tokens":401,"completion_tokens":1}})",
     Usage{400, 1, 401, 0}},
    {"openai_response_with_details",
     R"({
  "id": "chatcmpl-abc",
  "object": "chat.completion",
  "model": "gpt-4o-mini",
  "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
  "usage": {
    "prompt_tokens": 1200,
    "completion_tokens": 30,
    "total_tokens": 1230,
    "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0}
  },
  "system_fingerprint": "fp_1"
})",
     Usage{1200, 30, 1230, 1024}},
    {"details_null",
     R"({"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":null}})",
     Usage{1, 2, 3, 0}},
    {"cached_null",
     R"({"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":null}}})",
     Usage{1, 2, 3, 0}},
    {"details_without_cached", R"({"usage":{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens_details":{}}})",
     Usage{1, 2, 0, 0}},
    {"total_null", R"({"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":null}})", Usage{1, 2, 0, 0}},
    // A generation's usage that leaves its prompt or its completion out (absent or null) did not report it:
    // 0 is no count of it (the request is charged the part said and the estimate of the rest).
    {"prompt_null", R"({"usage":{"prompt_tokens":null,"completion_tokens":5,"total_tokens":null}})", std::nullopt,
     true},
    {"completion_null", R"({"usage":{"prompt_tokens":11,"completion_tokens":null,"total_tokens":null}})", std::nullopt,
     true},
    {"completion_absent", R"({"usage":{"prompt_tokens":11,"total_tokens":11}})", std::nullopt, true},
    {"prompt_only_pooling", R"({"usage":{"prompt_tokens":11,"total_tokens":11}})", Usage{11, 0, 11, 0}, false,
     UsageRoute::pooling},
    // total_tokens alone is vLLM's rerank's, all of it prompt; a generation's total counts its completion too.
    {"total_only_generation", R"({"usage":{"total_tokens":16}})", std::nullopt, true},
    {"audio_output_null", R"({"usage":{"type":"tokens","input_tokens":4,"output_tokens":null}})", std::nullopt, true},
    {"audio_tokens", R"({"usage":{"type":"tokens","input_tokens":4,"output_tokens":6}})", Usage{4, 6, 0, 0}},
    // No count at all: no usage reported, as none was sent (the no-usage estimate, not 0).
    {"counts_missing", R"({"usage":{}})", std::nullopt},
    {"counts_missing_pooling", R"({"usage":{}})", std::nullopt, false, UsageRoute::pooling},
    {"counts_all_null", R"({"usage":{"prompt_tokens":null,"completion_tokens":null,"total_tokens":null}})",
     std::nullopt},
    {"audio_duration", R"({"usage":{"type":"duration","seconds":3}})", std::nullopt},
    {"details_alone", R"({"usage":{"prompt_tokens_details":{"cached_tokens":0}}})", std::nullopt, true},
    {"extra_fields_ignored", R"({"usage":{"prompt_tokens":1,"completion_tokens":0,"foo":"bar","nested":{"x":[1.5]}}})",
     Usage{1, 0, 0, 0}},
    {"zero", R"({"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}})", Usage{0, 0, 0, 0}},
    {"largest_count", R"({"usage":{"prompt_tokens":16777216,"completion_tokens":16777216,"total_tokens":16777216}})",
     Usage{16777216u, 16777216u, 16777216u, 0}},  // 2^24: kMaxUsageTokens
    {"whitespace", " {\n \"usage\" :\t{ \"prompt_tokens\" : 7 ,\"completion_tokens\":1}\n}\n", Usage{7, 1, 0, 0}},
    {"duplicate_usage_last_wins",
     R"({"usage":{"prompt_tokens":1,"completion_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":1}})",
     Usage{2, 1, 0, 0}},
    {"escaped_key", R"({"us\u0061ge":{"prompt_tokens":3,"completion_tokens":1}})", Usage{3, 1, 0, 0}},
    {"usage_first", R"({"usage":{"prompt_tokens":0,"completion_tokens":9},"choices":[]})", Usage{0, 9, 0, 0}},

    // Past 2^24 (kMaxUsageTokens) no count is real: billed as sent, 2^31 sank a tenant's bucket and budget.
    {"past_2_24", R"({"usage":{"prompt_tokens":16777217}})", std::nullopt, true},
    {"prompt_2_31", R"({"usage":{"prompt_tokens":2147483648,"completion_tokens":1,"total_tokens":2147483649}})",
     std::nullopt, true},
    {"completion_past_2_24", R"({"usage":{"prompt_tokens":1,"completion_tokens":99999999}})", std::nullopt, true},
    {"cached_past_2_24", R"({"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":16777217}}})",
     std::nullopt, true},
    {"rerank_total_past_2_24", R"({"usage":{"total_tokens":16777217}})", std::nullopt, true},
    {"audio_input_past_2_24", R"({"usage":{"type":"tokens","input_tokens":16777217}})", std::nullopt, true},
    {"past_2_53", R"({"usage":{"prompt_tokens":9007199254740993}})", std::nullopt, true},
    {"largest_uint64", R"({"usage":{"prompt_tokens":18446744073709551615}})", std::nullopt, true},
    {"usage_null", R"({"choices":[],"usage":null})", std::nullopt},
    {"usage_absent", R"({"choices":[]})", std::nullopt},
    {"usage_number", R"({"usage":12})", std::nullopt, true},
    {"usage_string", R"({"usage":"12"})", std::nullopt, true},
    {"usage_array", R"({"usage":[{"prompt_tokens":1}]})", std::nullopt, true},
    {"usage_nested_only", R"({"choices":[{"usage":{"prompt_tokens":1}}]})", std::nullopt},
    {"fraction", R"({"usage":{"prompt_tokens":3.7}})", std::nullopt, true},
    {"integral_double", R"({"usage":{"prompt_tokens":12.0}})", std::nullopt, true},
    {"exponent", R"({"usage":{"prompt_tokens":1e300}})", std::nullopt, true},
    {"string_count", R"({"usage":{"prompt_tokens":"12"}})", std::nullopt, true},
    {"bool_count", R"({"usage":{"completion_tokens":true}})", std::nullopt, true},
    {"negative", R"({"usage":{"prompt_tokens":-5}})", std::nullopt, true},
    {"too_large", R"({"usage":{"prompt_tokens":18446744073709551616}})", std::nullopt, true},
    {"object_count", R"({"usage":{"prompt_tokens":{}}})", std::nullopt, true},
    {"cached_fraction", R"({"usage":{"prompt_tokens_details":{"cached_tokens":0.5}}})", std::nullopt, true},
    {"details_number", R"({"usage":{"prompt_tokens_details":5}})", std::nullopt, true},
    // A part of the prompt larger than the prompt: no count to bill (the log would say cached 5000 of 5).
    {"cached_over_prompt",
     R"({"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":5000}}})",
     std::nullopt, true},
    {"cached_without_prompt", R"({"usage":{"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1}}})",
     std::nullopt, true},
    {"cache_write_over_prompt", R"({"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cache_write_tokens":6}}})",
     std::nullopt, true},
    {"cached_all_of_prompt",
     R"({"usage":{"prompt_tokens":5,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":5}}})",
     Usage{5, 0, 0, 5}},
    {"invalid_usage_json", R"({"usage":{"prompt_tokens":01}})", std::nullopt, true},
    {"invalid_usage_json_missing_colon", R"({"usage":{"prompt_tokens" 1}})", std::nullopt, true},
    {"truncated", R"({"usage":{"prompt_tokens":1})", std::nullopt},
    {"not_an_object", R"([{"usage":{"prompt_tokens":1}}])", std::nullopt},
    {"empty", "", std::nullopt},
    {"done_sentinel", "[DONE]", std::nullopt},
};

INSTANTIATE_TEST_SUITE_P(Cases, ApiExtractUsage, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ApiExtractUsagePartial, SaysThePartReported) {
  // A generation's usage without its completion count: invalid, and its prompt (with its cache parts) said.
  bool invalid = false;
  PartialUsage said;
  EXPECT_FALSE(extract_usage(
      R"({"usage":{"prompt_tokens":11,"completion_tokens":null,"total_tokens":null,"prompt_tokens_details":{"cached_tokens":3,"cache_write_tokens":2}}})",
      &invalid, UsageRoute::generation, &said));
  EXPECT_TRUE(invalid);
  EXPECT_TRUE(said.prompt);
  EXPECT_FALSE(said.completion);
  EXPECT_EQ(counts(said.counts), (Counts{11, 0, 0, 3}));
  EXPECT_EQ(said.counts.cache_write_tokens, 2u);

  // Without its prompt count: the completion said, no prompt or cache part.
  said = {};
  EXPECT_FALSE(extract_usage(R"({"usage":{"completion_tokens":5}})", &invalid, UsageRoute::generation, &said));
  EXPECT_FALSE(said.prompt);
  EXPECT_TRUE(said.completion);
  EXPECT_EQ(counts(said.counts), (Counts{0, 5, 0, 0}));

  // A count that does not read says nothing, whatever else came with it.
  said = {};
  EXPECT_FALSE(extract_usage(R"({"usage":{"prompt_tokens":11,"completion_tokens":-1}})", &invalid,
                             UsageRoute::generation, &said));
  EXPECT_FALSE(said.prompt || said.completion);
  // Nor does one with neither part, or none at all.
  EXPECT_FALSE(extract_usage(R"({"usage":{"total_tokens":16}})", &invalid, UsageRoute::generation, &said));
  EXPECT_FALSE(extract_usage(R"({"usage":{}})", &invalid, UsageRoute::generation, &said));
  EXPECT_FALSE(said.prompt || said.completion);
}

TEST(ApiExtractUsageLarge, UsageBiggerThanTheStackBufferStillParses) {
  // The parse arena starts on the stack and falls back to the heap.
  std::string body =
      R"({"usage":{"prompt_tokens":5,"completion_tokens":1,"padding":")" + std::string(8000, 'x') + R"("}})";
  const auto got = extract_usage(body);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->prompt_tokens, 5u);
}

}  // namespace
}  // namespace weir::api
