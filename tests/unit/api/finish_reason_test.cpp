// finish_reason values: what each says of a generation (api/finish_reason.hpp), and what the translators and
// the relay's watch make of a failed one (vLLM's "abort", "error", "repetition", an unknown value).
#include "api/finish_reason.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "api/anthropic/response.hpp"
#include "api/anthropic/stream.hpp"
#include "api/responses/response.hpp"
#include "api/responses/stream.hpp"

namespace weir::api {
namespace {

constexpr std::string_view kFailed[] = {"abort", "error", "repetition"};

TEST(ApiFinishReason, EveryValueIsMappedDeliberately) {
  EXPECT_EQ(finish_of(""), Finish::none);
  EXPECT_EQ(finish_of("stop"), Finish::complete);
  EXPECT_EQ(finish_of("tool_calls"), Finish::complete);
  EXPECT_EQ(finish_of("function_call"), Finish::complete);
  EXPECT_EQ(finish_of("length"), Finish::length);
  EXPECT_EQ(finish_of("content_filter"), Finish::content_filter);
  for (const auto f : kFailed) EXPECT_EQ(finish_of(f), Finish::failed) << f;
  // Other servers' words for an ending (TGI's, Mistral's), and any value Weir does not know: an ending, as
  // before (a failure only where vLLM says one).
  EXPECT_EQ(finish_of("eos_token"), Finish::complete);
  EXPECT_EQ(finish_of("stop_sequence"), Finish::complete);
  EXPECT_EQ(finish_of("model_length"), Finish::length);
  EXPECT_EQ(finish_of("cancelled_by_tomorrows_vllm"), Finish::complete);
  EXPECT_EQ(finish_of("ABORT"), Finish::complete);  // (values are case-sensitive)
}

TEST(ApiFinishReason, FailedFinishInAnAnswerOrChunk) {
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"index":0,"message":{},"finish_reason":"abort","stop_reason":null}]})"),
            "abort");
  EXPECT_EQ(failed_finish_in(R"({"choices": [{"index": 0, "finish_reason" : "error"}]})"), "error");
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"finish_reason":"stop"},{"finish_reason":"repetition"}]})"), "repetition");
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]})"), "");
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"delta":{"content":"x"},"finish_reason":null}]})"), "");
  // The name inside a text is no member: escaped quotes, or no colon after it.
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"delta":{"content":"\"finish_reason\":\"abort\""}}]})"), "");
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"delta":{"content":"finish_reason"},"finish_reason":null}]})"), "");
  EXPECT_EQ(failed_finish_in(R"({"finish_reason":"ab)"), "");  // (an unclosed string says nothing)
  // Found wherever it falls in the answer, whatever underscores follow it.
  for (std::size_t pad = 0; pad < 40; ++pad)
    for (std::size_t tail = 0; tail < 20; ++tail) {
      const std::string j =
          R"({"a":")" + std::string(pad, 'x') + R"(","finish_reason":"abort","b":")" + std::string(tail, '_') + R"("})";
      EXPECT_EQ(failed_finish_in(j, 1), "abort") << pad << " " << tail;
    }
  // Read as JSON: an escape is the character it stands for.
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"finish_reason":"st\u006fp"}]})"), "");
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"finish_reason":"\u0061bort"}]})"), R"(\u0061bort)");
  // Read from the end: `choices` members at most (the request's n × prompts), whatever the message holds.
  const std::string snake(5000, '_');
  const std::string one = R"({"choices":[{"index":0,"message":{"content":")" + snake +
                          R"("},"finish_reason":"abort","stop_reason":null}],"usage":{"prompt_tokens":1}})";
  EXPECT_EQ(failed_finish_in(one, 1), "abort");
  EXPECT_EQ(failed_finish_in(one, 0), "abort");
  // A server that writes finish_reason first: found all the same (the search goes on through the message).
  EXPECT_EQ(failed_finish_in(R"({"choices":[{"finish_reason":"error","message":{"content":"a_b_c"}}]})", 1), "error");
  // Two choices, the first failed: found when both are looked for, the earliest kept.
  const char* two = R"({"choices":[{"finish_reason":"abort"},{"finish_reason":"error"},{"finish_reason":"stop"}]})";
  EXPECT_EQ(failed_finish_in(two, 0), "abort");
  EXPECT_EQ(failed_finish_in(two, 3), "abort");
  EXPECT_EQ(failed_finish_in(two, 2), "error");  // (the last two)
  EXPECT_EQ(failed_finish_in(R"({"finish_reason" : "abort"})", 1), "abort");
  EXPECT_EQ(failed_finish_in(R"(_finish_reason":"abort"})", 1), "");  // (no opening quote: no member)
}

TEST(ApiFinishReason, WatchFindsTheFailedFinishAfterContentChunksOfOneShape) {
  FinishWatch w;
  w.reset();
  const std::string head = R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[)";
  w.on_data(head + R"({"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})");
  for (int i = 0; i < 5; ++i)
    w.on_data(head + R"({"index":0,"delta":{"content":"tok)" + std::to_string(i) +
              R"("},"logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(w.failed(), "");
  w.on_data(head + R"({"index":0,"delta":{},"logprobs":null,"finish_reason":"abort","stop_reason":null}]})");
  EXPECT_EQ(w.failed(), "abort");
  w.on_data(R"({"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":5}})");
  EXPECT_EQ(w.failed(), "abort");
  w.reset();
  EXPECT_EQ(w.failed(), "");
}

TEST(ApiFinishReason, WatchOfSeveralChoicesReadsEveryChunk) {
  // n = 2: a chunk of both choices, the first's finish failed and the last's null, ends as a content chunk
  // of one choice does; the tail is not trusted then.
  FinishWatch w;
  w.reset(false);
  const std::string content = R"({"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]})";
  w.on_data(content);
  w.on_data(content);
  w.on_data(R"({"choices":[{"index":0,"delta":{},"finish_reason":"abort"},)"
            R"({"index":1,"delta":{"content":"a"},"finish_reason":null}]})");
  EXPECT_EQ(w.failed(), "abort");
}

TEST(ApiFinishReason, WatchReadsAFinishChunkWhoseTailDiffers) {
  // A finish chunk: its tail is not the content chunks', so it is read.
  FinishWatch w;
  w.reset();
  w.on_data(R"({"choices":[{"text":"a","finish_reason":null}]})");
  w.on_data(R"({"choices":[{"text":"b","finish_reason":null}]})");
  w.on_data(R"({"choices":[{"text":"","finish_reason":"error"}]})");
  EXPECT_EQ(w.failed(), "error");
  // Completions as vLLM streams them, stop_reason and usage after the finish; then a normal end.
  w.reset();
  const std::string c = R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x",)";
  w.on_data(c + R"("logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null})");
  w.on_data(c + R"("logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null})");
  w.on_data(c + R"("logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":null})");
  EXPECT_EQ(w.failed(), "");
}

TEST(ApiFinishReason, AnthropicMessageOfAFailedFinishIsAnError) {
  for (const auto f : kFailed) {
    const std::string body = std::string(R"({"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant",)"
                                         R"("content":"partial"},"finish_reason":")") +
                             std::string(f) + R"("}],"usage":{"prompt_tokens":3,"completion_tokens":2}})";
    std::string out, unfinished;
    EXPECT_FALSE(anthropic::translate_message(body, out, "req", true, &unfinished)) << f;
    EXPECT_EQ(unfinished, f);
    EXPECT_NE(out.find(R"("type":"api_error")"), std::string::npos) << out;
    EXPECT_NE(out.find(std::string("finish_reason \\\"") + std::string(f)), std::string::npos) << out;
    EXPECT_EQ(out.find("end_turn"), std::string::npos) << out;
  }
  // A whole one still translates, and says nothing unfinished.
  std::string out, unfinished = "x";
  EXPECT_TRUE(anthropic::translate_message(
      R"({"id":"chatcmpl-1","choices":[{"index":0,"message":{"content":"hi"},"finish_reason":"stop"}]})", out, "req",
      true, &unfinished));
  EXPECT_EQ(unfinished, "");
}

TEST(ApiFinishReason, ResponsesOfAFailedFinishIsUnfinished) {
  for (const auto f : kFailed) {
    const std::string body = std::string(R"({"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant",)"
                                         R"("content":"partial"},"finish_reason":")") +
                             std::string(f) + R"("}]})";
    std::string out;
    EXPECT_EQ(responses::translate_response(body, {}, "req", out), responses::Translated::unfinished) << f;
    EXPECT_EQ(out, f);
  }
}

std::string chunk(std::string_view delta, std::string_view finish) {
  return std::string(R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[)") +
         R"({"index":0,"delta":)" + std::string(delta) + R"(,"logprobs":null,"finish_reason":)" + std::string(finish) +
         "}]}";
}
constexpr std::string_view kUsage =
    R"({"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}})";

TEST(ApiFinishReason, AnthropicStreamOfAFailedFinishEndsWithAnErrorEvent) {
  for (const auto f : kFailed) {
    anthropic::StreamTranslator t;
    t.reset("req");
    std::string out;
    t.on_data(chunk(R"({"role":"assistant","content":""})", "null"), out);
    t.on_data(chunk(R"({"content":"partial"})", "null"), out);
    t.on_data(chunk("{}", "\"" + std::string(f) + "\""), out);
    EXPECT_FALSE(t.ended()) << out;  // (the usage chunk comes next: it is read first)
    t.on_data(kUsage, out);
    EXPECT_TRUE(t.failed()) << out;
    EXPECT_EQ(t.unfinished(), f);
    EXPECT_NE(out.find("event: error"), std::string::npos) << out;
    EXPECT_EQ(out.find("message_delta"), std::string::npos) << out;
    EXPECT_EQ(out.find("message_stop"), std::string::npos) << out;
  }
  // Without a usage chunk: at [DONE], and at the body's end.
  for (const bool done : {true, false}) {
    anthropic::StreamTranslator t;
    t.reset("req");
    std::string out;
    t.on_data(chunk(R"({"content":"partial"})", R"("abort")"), out);
    if (done)
      t.on_data("[DONE]", out);
    else
      t.finish(out);
    EXPECT_TRUE(t.failed()) << out;
  }
}

TEST(ApiFinishReason, ResponsesStreamOfAFailedFinishEndsWithResponseFailed) {
  for (const auto f : kFailed) {
    responses::StreamTranslator t;
    t.reset(R"("store":false)", "req", "m");
    std::string out;
    t.on_data(chunk(R"({"role":"assistant","content":""})", "null"), out);
    t.on_data(chunk(R"({"content":"partial"})", "null"), out);
    t.on_data(chunk("{}", "\"" + std::string(f) + "\""), out);
    t.on_data(kUsage, out);
    EXPECT_TRUE(t.failed()) << out;
    EXPECT_EQ(t.unfinished(), f);
    EXPECT_NE(out.find("event: response.failed"), std::string::npos) << out;
    EXPECT_NE(out.find(R"("code":"server_error")"), std::string::npos) << out;
    EXPECT_EQ(out.find("response.completed"), std::string::npos) << out;
    // Its usage is the upstream's: the usage chunk came before the failure was told.
    EXPECT_NE(out.find(R"("output_tokens":2)"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace weir::api
