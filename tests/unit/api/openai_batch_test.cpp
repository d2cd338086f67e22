// Micro-batch pieces of the completions wire (api/openai/batch.hpp): which
// bodies merge, the batch body, and the demultiplexing of an interleaved
// batched stream into each member's own chunks, byte for byte.
#include "api/openai/batch.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace weir::api::openai {
namespace {

std::optional<std::string> key_of(std::string_view body) {
  std::string key;
  auto p = completion_batch_key(body, key);
  if (!p) return std::nullopt;
  return key + " | " + std::string(*p);
}

TEST(CompletionBatchKey, IsTheBodyWithoutPromptAndUser) {
  EXPECT_EQ(key_of(R"({"model":"m","prompt":"hi","user":"u1","max_tokens":5,"temperature":0})"),
            R"({"model":"m","max_tokens":5,"temperature":0} | "hi")");
  // the same parameters in another order are another key: bytes must match
  EXPECT_NE(key_of(R"({"model":"m","prompt":"a","temperature":0,"max_tokens":5})")->substr(0, 40),
            key_of(R"({"model":"m","prompt":"a","max_tokens":5,"temperature":0})")->substr(0, 40));
  // users differ, keys do not
  std::string k1, k2;
  ASSERT_TRUE(completion_batch_key(R"({"model":"m","prompt":"a","user":"x"})", k1));
  ASSERT_TRUE(completion_batch_key(R"({"user":"y","model":"m","prompt":"b"})", k2));
  EXPECT_EQ(k1, k2);
}

TEST(CompletionBatchKey, NeverMergesWhatCannotBeSplit) {
  for (std::string_view body : {
           R"({"model":"m","prompt":["a","b"]})",        // a list already
           R"({"model":"m","prompt":[1,2,3]})",          // token ids
           R"({"model":"m"})",                           // no prompt
           R"({"model":"m","prompt":"a","n":2})",        // several choices per prompt
           R"({"model":"m","prompt":"a","best_of":2})",  //
           R"({"model":"m","prompt":"a","echo":true})",
           R"({"model":"m","prompt":"a","logprobs":1})",
           R"({"model":"m","prompt":"a","prompt_logprobs":0})",
           R"({"model":"m","prompt":"a","suffix":"z"})",
           R"(["not an object"])",
       })
    EXPECT_FALSE(key_of(body)) << body;
  for (std::string_view body : {
           R"({"model":"m","prompt":"a","n":1})",
           R"({"model":"m","prompt":"a","echo":false,"logprobs":null,"suffix":null})",
       })
    EXPECT_TRUE(key_of(body)) << body;
}

// A non-streaming member's answer is assembled in vLLM's non-streamed shape: a request with a member that may
// add to that shape (vLLM's return_token_ids, kv_transfer_params, one Weir does not know) is not batched; a
// streaming one (its chunks are the upstream's bytes) is.
TEST(CompletionBatchKey, NonStreamingOnlyWhenTheAssembledShapeHoldsItsAnswer) {
  for (std::string_view body : {
           R"({"model":"m","prompt":"a","return_token_ids":true})",
           R"({"model":"m","prompt":"a","kv_transfer_params":{"do_remote_decode":true}})",
           R"({"model":"m","prompt":"a","vllm_xargs":{"k":1}})",
           R"({"model":"m","prompt":"a","stream":false,"some_new_flag":1})",
           R"({"model":"m","prompt":"a","\u0072eturn_token_ids":true})",  // (an escaped key is still read)
       })
    EXPECT_FALSE(key_of(body)) << body;
  for (std::string_view body : {
           R"({"model":"m","prompt":"a","return_token_ids":false,"kv_transfer_params":null})",
           R"({"model":"m","prompt":"a","max_tokens":5,"temperature":0.2,"top_p":0.9,"top_k":5,"seed":1,)"
           R"("stop":["x"],"frequency_penalty":0.1,"presence_penalty":0.1,"repetition_penalty":1.1,"min_p":0.1,)"
           R"("ignore_eos":true,"min_tokens":1,"logit_bias":{"1":2},"guided_json":{},"user":"u","stream":false})",
           R"({"model":"m","prompt":"a","stream":true,"return_token_ids":true})",
           R"({"model":"m","prompt":"a","stream":true,"vllm_xargs":{"k":1}})",
       })
    EXPECT_TRUE(key_of(body)) << body;
}

TEST(CompletionBatch, BodyHasEveryPromptStreamAndPerChunkUsage) {
  std::string key, scratch, out;
  ASSERT_TRUE(completion_batch_key(R"({"model":"m","prompt":"x","max_tokens":3})", key));
  const std::vector<std::string_view> prompts = {R"("one")", R"("t\"wo")"};
  build_completion_batch(key, prompts, scratch, out);
  const auto v = boost::json::parse(out).as_object();
  EXPECT_EQ(v.at("prompt"), boost::json::parse(R"(["one","t\"wo"])"));
  EXPECT_EQ(v.at("stream"), true);
  EXPECT_EQ(v.at("stream_options"), boost::json::parse(R"({"include_usage":true,"continuous_usage_stats":true})"));
  EXPECT_EQ(v.at("max_tokens"), 3);
  EXPECT_EQ(v.at("model"), "m");
}

// vLLM's chunk for prompt `i` of a batch (serving_completion.py with continuous usage).
std::string chunk(std::uint32_t index, std::string_view text, std::string_view finish, std::uint32_t prompt_tokens,
                  std::uint32_t done) {
  return "{\"id\":\"cmpl-batch7\",\"object\":\"text_completion\",\"created\":17,\"model\":\"m\",\"choices\":[{"
         "\"index\":" +
         std::to_string(index) + ",\"text\":\"" + std::string(text) +
         "\",\"logprobs\":null,\"finish_reason\":" + std::string(finish) +
         ",\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":" + std::to_string(prompt_tokens) +
         ",\"total_tokens\":" + std::to_string(prompt_tokens + done) +
         ",\"completion_tokens\":" + std::to_string(done) + ",\"prompt_tokens_details\":null}}";
}

TEST(BatchChunk, ParsesChoiceUsageAndOther) {
  const std::string c = chunk(3, " word", "null", 4, 1);
  const BatchChunk p = parse_batch_chunk(c);
  ASSERT_EQ(p.kind, BatchChunk::Kind::choice);
  EXPECT_EQ(p.index, 3u);
  EXPECT_EQ(c.substr(p.text->value_begin, p.text->value_end - p.text->value_begin), "\" word\"");
  EXPECT_EQ(c.substr(p.index_value.begin, p.index_value.end - p.index_value.begin), "3");
  const std::string u =
      R"({"id":"cmpl-batch7","object":"text_completion","created":17,"model":"m","choices":[],"usage":{"prompt_tokens":9,"total_tokens":15,"completion_tokens":6}})";
  EXPECT_EQ(parse_batch_chunk(u).kind, BatchChunk::Kind::usage);
  EXPECT_EQ(parse_batch_chunk(R"({"error":{"message":"boom","code":500}})").kind, BatchChunk::Kind::error);
  EXPECT_EQ(parse_batch_chunk(R"({"id":"x","choices":[]})").kind, BatchChunk::Kind::empty);
  // A choice whose owner cannot be read: no member's (the demultiplexer fails the batch).
  for (const char* index : {R"("x")", "-1", "1.0", "null", "18446744073709551616", "[0]"})
    EXPECT_EQ(parse_batch_chunk(fmt::format(R"({{"choices":[{{"index":{},"text":"t"}}]}})", index)).kind,
              BatchChunk::Kind::other)
        << index;
  EXPECT_EQ(parse_batch_chunk(R"({"choices":[{"text":"t"}]})").kind, BatchChunk::Kind::other);  // no index
  // Two members' choices in one chunk: neither may be given the other's.
  EXPECT_EQ(parse_batch_chunk(R"({"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]})").kind,
            BatchChunk::Kind::other);
  EXPECT_EQ(parse_batch_chunk(R"({"choices":[{"index":0,"text":"a"} ]})").kind, BatchChunk::Kind::choice);
  EXPECT_EQ(parse_batch_chunk("not json").kind, BatchChunk::Kind::other);
}

TEST(BatchDemux, InterleavedStreamGivesEachMemberItsOwnChunksInOrder) {
  // Three members' tokens interleaved as vLLM emits them (prompt lengths 2, 5, 3).
  const std::uint32_t prompt_tokens[] = {2, 5, 3};
  const char* words[3][2] = {{" a0", " a1"}, {" b0", " b1"}, {" c0", " c1"}};
  std::vector<std::string> upstream;
  for (int step = 0; step < 2; ++step)
    for (std::uint32_t i : {2u, 0u, 1u})
      upstream.push_back(chunk(i, words[i][step], step == 1 ? "\"length\"" : "null", prompt_tokens[i], step + 1));
  std::map<std::uint32_t, std::vector<std::string>> got;
  std::map<std::uint32_t, std::string> last_usage;
  for (const auto& data : upstream) {
    const BatchChunk c = parse_batch_chunk(data);
    ASSERT_EQ(c.kind, BatchChunk::Kind::choice);
    last_usage[c.index] = data.substr(c.usage->value_begin, c.usage->value_end - c.usage->value_begin);
    std::string id;
    append_member_id(data.substr(c.id->value_begin, c.id->value_end - c.id->value_begin), "batch7",
                     "req-" + std::to_string(c.index), c.index, id);
    std::string out;
    append_member_chunk(data, c, id, "null", out);
    got[c.index].push_back(out);
  }
  for (std::uint32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(got[i].size(), 2u);
    for (int step = 0; step < 2; ++step) {
      // exactly what the member would get unbatched (its own id, index 0, no usage asked for)
      std::string want = "{\"id\":\"cmpl-req-" + std::to_string(i) +
                         "\",\"object\":\"text_completion\",\"created\":17,\"model\":\"m\",\"choices\":[{\"index\":0,"
                         "\"text\":\"" +
                         words[i][step] +
                         "\",\"logprobs\":null,\"finish_reason\":" + (step == 1 ? "\"length\"" : "null") +
                         ",\"stop_reason\":null}],\"usage\":null}";
      EXPECT_EQ(got[i][step], want);
    }
  }
  // each member's own usage, in the final chunk's exact shape
  std::string u;
  ASSERT_TRUE(append_member_usage(R"({"prompt_tokens":10,"total_tokens":16,"completion_tokens":6})", last_usage[1], u));
  EXPECT_EQ(u, R"({"prompt_tokens":5,"total_tokens":7,"completion_tokens":2})");
  std::string bad;
  EXPECT_FALSE(append_member_usage(R"({"prompt_tokens":10})", last_usage[1], bad));
  EXPECT_TRUE(bad.empty());
}

TEST(BatchDemux, AMembersUsageNeverCarriesTheBatchsDetails) {
  // vLLM's final chunk of a prompt list carries one prompt's cached tokens (its first result's): spliced into
  // any one member's usage it could bill that member less than its cost.
  std::string u;
  ASSERT_TRUE(append_member_usage(
      R"({"prompt_tokens":8,"total_tokens":12,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":3}})",
      R"({"prompt_tokens":4,"total_tokens":6,"completion_tokens":2,"prompt_tokens_details":null})", u));
  EXPECT_EQ(u, R"({"prompt_tokens":4,"total_tokens":6,"completion_tokens":2})");
  u.clear();
  ASSERT_TRUE(append_member_usage(
      R"({"prompt_tokens_details":{"cached_tokens":3},"prompt_tokens":8,"completion_tokens_details":{"reasoning_tokens":1},"total_tokens":12,"completion_tokens":4})",
      R"({"prompt_tokens":4,"total_tokens":6,"completion_tokens":2})", u));
  EXPECT_EQ(u, R"({"prompt_tokens":4,"total_tokens":6,"completion_tokens":2})");
}

TEST(CompletionAssembler, ALoneMembersAnswerTakesItsCachedTokensFromTheFinalUsage) {
  // A batch of one: the final usage chunk is the member's own; its per-chunk usage keeps vLLM's non-streamed
  // shape ("prompt_tokens_details": null in place), with the final chunk's details.
  CompletionAssembler a;
  a.reset();
  const std::string data = chunk(1, " one", "\"length\"", 4, 1);
  a.on_chunk(data, parse_batch_chunk(data));
  a.on_own_total(
      R"({"prompt_tokens":4,"total_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}})");
  std::string out;
  a.finish(R"("cmpl-r")", out);
  EXPECT_NE(
      out.find(
          R"("usage":{"prompt_tokens":4,"total_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}},)"),
      std::string::npos)
      << out;
  // Nothing cached (vLLM's final chunk then has no details): the per-chunk usage as it was.
  a.reset();
  a.on_chunk(data, parse_batch_chunk(data));
  a.on_own_total(R"({"prompt_tokens":4,"total_tokens":5,"completion_tokens":1})");
  out.clear();
  a.finish(R"("cmpl-r")", out);
  EXPECT_NE(
      out.find(R"("usage":{"prompt_tokens":4,"total_tokens":5,"completion_tokens":1,"prompt_tokens_details":null},)"),
      std::string::npos)
      << out;
  // No per-chunk usage at all: the final usage is the member's.
  a.reset();
  const std::string bare =
      R"({"id":"cmpl-b","created":17,"model":"m","choices":[{"index":0,"text":"x","finish_reason":"stop"}]})";
  a.on_chunk(bare, parse_batch_chunk(bare));
  a.on_own_total(
      R"({"prompt_tokens":4,"total_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}})");
  out.clear();
  a.finish(R"("cmpl-r")", out);
  EXPECT_EQ(boost::json::parse(out).at("usage").at("prompt_tokens_details").at("cached_tokens"), 2);
}

TEST(BatchDemux, MemberIdsEscapeAClientsRequestId) {
  std::string id;
  append_member_id(R"("cmpl-b1")", "b1", R"(my"id\)", 0, id);
  EXPECT_EQ(id, R"("cmpl-my\"id\\")");
  EXPECT_EQ(boost::json::parse(id).as_string(), R"(cmpl-my"id\)");
  id.clear();
  append_member_id(R"("other-upstream-id")", "b1", "r", 2, id);  // not vLLM's id shape
  EXPECT_EQ(id, R"("other-upstream-id-2")");
}

TEST(CompletionAssembler, BuildsVllmsNonStreamingBody) {
  CompletionAssembler a;
  a.reset();
  for (const auto& data : {chunk(1, " one", "null", 4, 1), chunk(1, " \\\"two\\\"", "\"length\"", 4, 2)})
    a.on_chunk(data, parse_batch_chunk(data));
  std::string out;
  a.finish(R"("cmpl-r")", out);
  EXPECT_EQ(
      out,
      R"({"id":"cmpl-r","object":"text_completion","created":17,"model":"m","choices":[{"index":0,"text":" one \"two\"","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2,"prompt_tokens_details":null},"kv_transfer_params":null})");
  EXPECT_EQ(a.chunks(), 2u);
  EXPECT_EQ(boost::json::parse(out).at("choices").at(0).at("text"), " one \"two\"");
}

// A request for vLLM's disaggregated serving gets its own transfer handle in the answer (the KV or encoder cache
// blocks one decoder pulls): never a generation shared with an identical request. Null is no request for it.
TEST(CoalesceKey, DisaggregatedServingRequestsNeverShareAGeneration) {
  std::string key;
  EXPECT_TRUE(coalesce_key(R"({"model":"m","messages":[],"temperature":0})", key));
  EXPECT_TRUE(coalesce_key(R"({"model":"m","messages":[],"temperature":0,"kv_transfer_params":null})", key));
  EXPECT_TRUE(coalesce_key(R"({"model":"m","prompt":"p","seed":1,"request_id":"r","priority":1})", key));
  for (
      std::string_view body : {
          R"({"model":"m","messages":[],"temperature":0,"kv_transfer_params":{"do_remote_decode":true}})",
          R"({"model":"m","prompt":"p","seed":3,"kv_transfer_params":{}})",
          R"({"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1]},"model":"m","messages":[],"temperature":0})",
          R"({"model":"m","messages":[],"temperature":0,"ec_transfer_params":{"x":1}})",
      })
    EXPECT_FALSE(coalesce_key(body, key)) << body;
}

}  // namespace
}  // namespace weir::api::openai
