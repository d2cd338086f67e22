// Resume mid-stream pieces (api/openai/resume.hpp): the notes taken of a
// stream as it passes, the continuation body built from the original
// request, and the rewrite of the continuation's chunks into the client's stream.
#include "api/openai/resume.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <string>

namespace weir::api::openai {
namespace {

namespace json = boost::json;

std::string chunk(std::string_view id, std::string_view delta, std::string_view finish = "null") {
  return std::string(R"({"id":")") + std::string(id) +
         R"(","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":)" +
         std::string(delta) + R"(,"logprobs":null,"finish_reason":)" + std::string(finish) + "}]}";
}

TEST(ResumeTracker, KeepsTheTextEscapedAndCountsContentChunks) {
  ResumeTracker t;
  t.reset(64);
  EXPECT_FALSE(t.noted());
  EXPECT_EQ(t.on_chunk(chunk("chatcmpl-1", R"({"role":"assistant","content":""})")), ChunkNote::other);
  // The role chunk alone: no content, nothing ruling a resend out (begin_resume sends the request again).
  EXPECT_TRUE(t.noted());
  EXPECT_FALSE(t.content());
  EXPECT_TRUE(t.resumable());
  EXPECT_EQ(t.id_json(), R"("chatcmpl-1")");
  EXPECT_EQ(t.created_json(), "1700000000");
  EXPECT_EQ(t.model_json(), R"("m")");
  t.on_chunk(chunk("chatcmpl-1", R"({"content":" h\u00e9 \"q\""})"));
  t.on_chunk(chunk("chatcmpl-1", R"({"content":"\ud83d"})"));
  t.on_chunk(chunk("chatcmpl-1", R"({"content":"\ude00\n"})"));
  EXPECT_TRUE(t.resumable());
  EXPECT_TRUE(t.content());
  EXPECT_EQ(t.tokens(), 3u);
  EXPECT_EQ(t.text_json(), R"( h\u00e9 \"q\"\ud83d\ude00\n)");
  // the first chunk's ids stay
  t.on_chunk(chunk("chatcmpl-2", R"({"content":"x"})"));
  EXPECT_EQ(t.id_json(), R"("chatcmpl-1")");
}

TEST(ResumeTracker, ToolCallsReasoningAndOtherChoicesBlock) {
  ResumeTracker t;
  t.reset(0);
  t.on_chunk(chunk("c", R"({"content":"a"})"));
  EXPECT_EQ(t.on_chunk(chunk("c", R"({"tool_calls":[{"index":0,"id":"x"}]})")), ChunkNote::blocked);
  EXPECT_FALSE(t.resumable());
  t.reset(0);
  EXPECT_EQ(t.on_chunk(chunk("c", R"({"reasoning_content":"hm"})")), ChunkNote::blocked);
  t.reset(0);
  EXPECT_EQ(t.on_chunk(R"({"id":"c","choices":[{"index":1,"delta":{"content":"a"}}]})"), ChunkNote::blocked);
  t.reset(0);
  EXPECT_EQ(t.on_chunk(R"({"id":"c","choices":[{"index":0,"delta":{"content":"a"}},{"index":1}]})"),
            ChunkNote::blocked);
  // empty tool_calls and null reasoning do not
  t.reset(0);
  EXPECT_EQ(t.on_chunk(chunk("c", R"({"content":"a","tool_calls":[],"reasoning_content":null})")), ChunkNote::other);
  EXPECT_TRUE(t.resumable());
}

TEST(ResumeTracker, FinishErrorsUsageAndGarbage) {
  ResumeTracker t;
  t.reset(0);
  t.on_chunk(chunk("c", R"({"content":" a"})", R"("length")"));
  EXPECT_TRUE(t.finished());
  EXPECT_FALSE(t.resumable());
  t.reset(0);
  EXPECT_EQ(t.on_chunk(R"({"error":{"message":"boom","code":500}})"), ChunkNote::error);
  EXPECT_FALSE(t.noted());  // (an error event does not reach the client when a resume may mend it)
  EXPECT_FALSE(t.content());
  // continuous usage stats: the count is the upstream's
  t.reset(0);
  t.on_chunk(R"({"id":"c","choices":[{"index":0,"delta":{"content":" a b"}}],"usage":{"prompt_tokens":5,)"
             R"("total_tokens":12,"completion_tokens":7}})");
  EXPECT_EQ(t.tokens(), 7u);
  // bad input: nothing noted, nothing thrown
  t.reset(0);
  for (std::string_view bad : {"", "[", "{", "null", R"({"choices":)", R"({"choices":[{"delta":"x"}]})",
                               R"({"choices":[{"delta":{"content":5}}]})", "\xff\xfe"})
    EXPECT_EQ(t.on_chunk(bad), ChunkNote::other) << bad;
  EXPECT_FALSE(t.content());
  EXPECT_FALSE(t.blocked());
}

json::object parse(const std::string& s) { return json::parse(s).as_object(); }

TEST(ContinuationBody, AppendsTheAssistantTextAndKeepsTheRest) {
  const std::string body =
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"h\u00e9llo \"you\""}],)"
      R"("stream":true,"stream_options":{"include_usage":true},"max_tokens":20,"temperature":0.7,"seed":12345678901,)"
      R"("stop":["\n\n"],"user":"u","extra":{"a":[1,2,{"b":null}]}})";
  std::string out;
  ASSERT_EQ(continuation_body(body, R"( caf\u00e9 \"ok\"\ud83d\ude00\n)", 5, out), Continuation::ok);
  const auto o = parse(out);
  const auto& msgs = o.at("messages").as_array();
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[1].at("content").as_string(), "h\u00e9llo \"you\"");
  EXPECT_EQ(msgs[2].at("role").as_string(), "assistant");
  EXPECT_EQ(msgs[2].at("content").as_string(), " caf\u00e9 \"ok\"\xF0\x9F\x98\x80\n");
  EXPECT_EQ(o.at("max_tokens").as_int64(), 15);
  EXPECT_EQ(o.at("continue_final_message").as_bool(), true);
  EXPECT_EQ(o.at("add_generation_prompt").as_bool(), false);
  // everything else as it was
  const auto orig = parse(body);
  for (const char* k : {"model", "stream", "stream_options", "temperature", "seed", "stop", "user", "extra"})
    EXPECT_EQ(o.at(k), orig.at(k)) << k;
  EXPECT_EQ(o.size(), orig.size() + 2);
}

TEST(ContinuationBody, KeepsIntegersBeyond64BitsExactly) {
  // A tool's schema with a bound past 64 bits: Boost.JSON holds it as a double, which would be written
  // 1.8446744073709552E19.
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":8,"tools":[{"type":"function",)"
      R"("function":{"name":"f","parameters":{"type":"integer","maximum":18446744073709551617,)"
      R"("minimum":-123456789012345678901234567890}}}]})";
  std::string out;
  ASSERT_EQ(continuation_body(body, "a", 5, out), Continuation::ok);
  EXPECT_NE(out.find(R"("maximum":18446744073709551617,"minimum":-123456789012345678901234567890)"), std::string::npos)
      << out;
  EXPECT_EQ(parse(out).at("max_tokens").as_int64(), 3);
  // A limit past 64 bits is still nothing Weir can lower.
  EXPECT_EQ(continuation_body(R"({"messages":[],"max_tokens":18446744073709551617})", "a", 3, out),
            Continuation::unsupported);
}

TEST(ContinuationBody, LowersBothLimitsAndFinishesWhenSpent) {
  std::string out;
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":8,"max_completion_tokens":6,"min_tokens":4})";
  ASSERT_EQ(continuation_body(body, "a", 5, out), Continuation::ok);
  const auto o = parse(out);
  EXPECT_EQ(o.at("max_tokens").as_int64(), 3);
  EXPECT_EQ(o.at("max_completion_tokens").as_int64(), 1);
  EXPECT_EQ(o.at("min_tokens").as_int64(), 0);
  EXPECT_EQ(continuation_body(body, "a", 6, out), Continuation::exhausted);
  EXPECT_EQ(continuation_body(R"({"messages":[],"max_tokens":3})", "a", 3, out), Continuation::exhausted);
  // A min_tokens Weir cannot lower (50.0: vLLM reads 50) is no continuation: it would force the minimum again.
  EXPECT_EQ(continuation_body(R"({"messages":[],"min_tokens":50.0})", "a", 3, out), Continuation::unsupported);
  ASSERT_EQ(continuation_body(R"({"messages":[],"min_tokens":null})", "a", 3, out), Continuation::ok);
  // no limit: none added
  ASSERT_EQ(continuation_body(R"({"messages":[]})", "a", 1000, out), Continuation::ok);
  EXPECT_FALSE(parse(out).contains("max_tokens"));
}

TEST(ContinuationBody, ContinuesTheClientsOwnFinalAssistantMessage) {
  std::string out;
  ASSERT_EQ(continuation_body(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"Once"}],)"
                              R"("continue_final_message":true,"add_generation_prompt":false,"echo":true})",
                              " upon", 1, out),
            Continuation::ok);
  const auto o = parse(out);
  ASSERT_EQ(o.at("messages").as_array().size(), 2u);
  EXPECT_EQ(o.at("messages").as_array()[1].at("content").as_string(), "Once upon");
  EXPECT_FALSE(o.contains("echo"));
}

TEST(ContinuationBody, ContinuesAFinalAssistantMessageOfTextParts) {
  // The prefill as content parts: the text goes on in its last text part, not in a second assistant
  // message (whose template would end the first turn before it).
  std::string out;
  ASSERT_EQ(continuation_body(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":)"
                              R"([{"type":"text","text":"A"},{"type":"text","text":"PRE:"}]}],)"
                              R"("continue_final_message":true,"add_generation_prompt":false})",
                              "AAA BBB", 1, out),
            Continuation::ok);
  const auto doc = parse(out);
  const auto& msgs = doc.at("messages").as_array();
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[1].at("content").as_array()[0].at("text").as_string(), "A");
  EXPECT_EQ(msgs[1].at("content").as_array()[1].at("text").as_string(), "PRE:AAA BBB");
  // A last part that is no text (an image): the continuation is a message of its own.
  ASSERT_EQ(continuation_body(R"({"messages":[{"role":"assistant","content":[{"type":"image_url","image_url":)"
                              R"({"url":"u"}}]}],"continue_final_message":true})",
                              "x", 1, out),
            Continuation::ok);
  EXPECT_EQ(parse(out).at("messages").as_array().size(), 2u);
}

TEST(ContinuationBody, RefusesWhatItCannotContinue) {
  std::string out;
  for (std::string_view bad :
       {"", "{", "[]", "null", R"({"model":"m"})", R"({"messages":{}})", R"({"messages":[],"max_tokens":"5"})",
        R"({"messages":[],"max_tokens":1.5})", R"({"messages":[],"t":1e400})"})
    EXPECT_EQ(continuation_body(bad, "a", 1, out), Continuation::unsupported) << bad;
  // text that is not valid JSON string contents (a lone quote, a bad escape)
  EXPECT_EQ(continuation_body(R"({"messages":[]})", "a\"b", 1, out), Continuation::unsupported);
  EXPECT_EQ(continuation_body(R"({"messages":[]})", "a\\x", 1, out), Continuation::unsupported);
}

TEST(ResumeExcluded, LogprobsAndN) {
  EXPECT_FALSE(resume_excluded(R"({"model":"m","messages":[],"logprobs":false,"n":1,"top_logprobs":null})"));
  EXPECT_TRUE(resume_excluded(R"({"logprobs":true})"));
  EXPECT_TRUE(resume_excluded(R"({"top_logprobs":2})"));
  EXPECT_TRUE(resume_excluded(R"({"prompt_logprobs":1})"));
  EXPECT_TRUE(resume_excluded(R"({"n":2})"));
  EXPECT_TRUE(resume_excluded("not json"));
}

TEST(ResumeExcluded, EchoAndPrefillFlagsVllmWouldReadOtherwise) {
  // vLLM's chat echo streams the prefill as its own first chunk: the continuation would hold it twice.
  EXPECT_TRUE(resume_excluded(R"({"echo":true})"));
  EXPECT_FALSE(resume_excluded(R"({"echo":false,"continue_final_message":true,"add_generation_prompt":false})"));
  EXPECT_FALSE(resume_excluded(R"({"echo":null,"continue_final_message":null})"));
  // Flags pydantic reads as booleans but Weir would not: "true", 1.
  EXPECT_TRUE(resume_excluded(R"({"continue_final_message":"true"})"));
  EXPECT_TRUE(resume_excluded(R"({"continue_final_message":1})"));
  EXPECT_TRUE(resume_excluded(R"({"add_generation_prompt":"false"})"));
}

TEST(ResumeExcluded, StructuredOutput) {
  // vLLM's grammar covers generated tokens only: a continuation would start the document over.
  EXPECT_FALSE(resume_excluded(R"({"response_format":{"type":"text"},"guided_json":null})"));
  EXPECT_FALSE(resume_excluded(R"({"response_format":null})"));
  EXPECT_TRUE(resume_excluded(R"({"response_format":{"type":"json_object"}})"));
  EXPECT_TRUE(resume_excluded(R"({"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})"));
  EXPECT_TRUE(resume_excluded(R"({"response_format":{"json_schema":{}}})"));
  EXPECT_TRUE(resume_excluded(R"({"response_format":"json"})"));
  for (const char* k :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs", "structural_tag"})
    EXPECT_TRUE(resume_excluded(fmt::format(R"({{"{}":["a","b"]}})", k))) << k;
}

TEST(RewriteChunk, UsageCountsTheWholeMessageAndCachedTokensStayWithinThePrompt) {
  // The continuation was given 5 prompt tokens + 2 generated back; it reports 7 prompt, all 7 cached.
  std::string out, scratch;
  const std::string c =
      R"({"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":)"
      R"({"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":7}}})";
  ASSERT_EQ(rewrite_chunk(c, "", "", "", 2, out, scratch), Rewrite::changed);
  const auto u = parse(out).at("usage");
  EXPECT_EQ(u.at("prompt_tokens").as_int64(), 5);
  EXPECT_EQ(u.at("completion_tokens").as_int64(), 5);
  EXPECT_EQ(u.at("total_tokens").as_int64(), 10);
  EXPECT_EQ(u.at("prompt_tokens_details").at("cached_tokens").as_int64(), 5);
}

TEST(RewriteChunk, SetsTheOriginalIdsWhereTheyDiffer) {
  std::string out, scratch;
  const std::string c = chunk("chatcmpl-new", R"({"content":" b"})");
  ASSERT_EQ(rewrite_chunk(c, R"("chatcmpl-old")", "1600000000", R"("orig")", 3, out, scratch), Rewrite::changed);
  const auto o = parse(out);
  EXPECT_EQ(o.at("id").as_string(), "chatcmpl-old");
  EXPECT_EQ(o.at("created").as_int64(), 1600000000);
  EXPECT_EQ(o.at("model").as_string(), "orig");
  EXPECT_EQ(o.at("choices").as_array()[0].at("delta").at("content").as_string(), " b");
  // the same ids: nothing to do
  EXPECT_EQ(rewrite_chunk(c, R"("chatcmpl-new")", "1700000000", R"("m")", 3, out, scratch), Rewrite::keep);
  // an id with escapes is compared as JSON text and written as such
  ASSERT_EQ(rewrite_chunk(c, R"("a\"b\u00e9")", "", "", 0, out, scratch), Rewrite::changed);
  EXPECT_EQ(parse(out).at("id").as_string(), "a\"b\u00e9");
}

TEST(RewriteChunk, DropsTheRoleChunkOnly) {
  std::string out, scratch;
  EXPECT_EQ(rewrite_chunk(chunk("x", R"({"role":"assistant","content":""})"), R"("x")", "", "", 0, out, scratch),
            Rewrite::drop);
  EXPECT_EQ(rewrite_chunk(chunk("x", R"({"role":"assistant"})"), R"("x")", "", "", 0, out, scratch), Rewrite::drop);
  EXPECT_EQ(rewrite_chunk(chunk("x", R"({"role":"assistant","content":" hi"})"), R"("x")", "", "", 0, out, scratch),
            Rewrite::keep);
  EXPECT_EQ(
      rewrite_chunk(chunk("x", R"({"role":"assistant","content":""})", R"("stop")"), R"("x")", "", "", 0, out, scratch),
      Rewrite::keep);
}

TEST(RewriteChunk, MovesThePrefixFromPromptToCompletionTokens) {
  std::string out, scratch;
  const std::string u =
      R"({"id":"new","object":"chat.completion.chunk","created":1,"model":"m","choices":[],)"
      R"("usage":{"prompt_tokens":17,"total_tokens":27,"completion_tokens":10,"prompt_tokens_details":null}})";
  ASSERT_EQ(rewrite_chunk(u, R"("old")", "", "", 5, out, scratch), Rewrite::changed);
  const auto o = parse(out);
  EXPECT_EQ(o.at("id").as_string(), "old");
  const auto& usage = o.at("usage").as_object();
  EXPECT_EQ(usage.at("prompt_tokens").as_int64(), 12);
  EXPECT_EQ(usage.at("completion_tokens").as_int64(), 15);
  EXPECT_EQ(usage.at("total_tokens").as_int64(), 27);
  EXPECT_TRUE(usage.at("prompt_tokens_details").is_null());
}

TEST(RewriteChunk, BadInputIsKept) {
  std::string out, scratch;
  for (std::string_view bad : {"", "{", "[1]", R"({"id":)", "\x01\x02", R"({"choices":[{"delta":{"role":1}}]})"})
    EXPECT_NE(rewrite_chunk(bad, R"("a")", "1", R"("m")", 2, out, scratch), Rewrite::changed) << bad;
}

}  // namespace
}  // namespace weir::api::openai
