// event_text_bytes and answer_text_bytes: the generated text an answer without usage is charged for.
#include "api/text_estimate.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace weir::api {
namespace {

TEST(ApiTextEstimate, ChatChunkCountsOnlyTheDeltaText) {
  // vLLM's chunk: the id, model and logprobs are not text; the delta's content is (5 bytes).
  EXPECT_EQ(event_text_bytes(
                R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"delta","choices":[)"
                R"({"index":0,"delta":{"content":"Hello"},"logprobs":{"content":[{"token":"Hello","logprob":-0.1,)"
                R"("bytes":[72,101,108,108,111],"top_logprobs":[]}]},"finish_reason":null}]})"),
            5u);
  // Python's json.dumps spacing, as some servers send it.
  EXPECT_EQ(event_text_bytes(R"({"choices": [{"index": 0, "delta": {"content": "token token"}}]})"), 11u);
  // The role chunk and a finish chunk carry none.
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"index":0,"delta":{"content":null}}]})"), 0u);
}

TEST(ApiTextEstimate, EscapesCountAsTheTextTheyStandFor) {
  // \n 1, \" 1, \u00e9 (é) 2, \u4e2d (中) 3, a surrogate pair (😀) 4, as UTF-8 has them.
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"content":"a\n\"\u00e9\u4e2d\ud83d\ude00"}}]})"),
            1u + 1 + 1 + 2 + 3 + 4);
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"content":"é中"}}]})"), 5u);
}

TEST(ApiTextEstimate, ReasoningAndToolCalls) {
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"reasoning_content":"think"}}]})"), 5u);
  // vLLM's newer `reasoning` beside `reasoning_content` (the same text): counted once.
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"reasoning_content":"think","reasoning":"think"}}]})"), 5u);
  // A tool call's name and arguments; its id and type are not text.
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_123","type":"function",)"
                             R"("function":{"name":"get","arguments":"{\"a\":1}"}}]}}]})"),
            3u + 7);
}

TEST(ApiTextEstimate, EveryChoiceOfAChunk) {
  EXPECT_EQ(
      event_text_bytes(R"({"choices":[{"index":0,"delta":{"content":"ab"}},{"index":1,"delta":{"content":"cde"}}]})"),
      5u);
}

TEST(ApiTextEstimate, CompletionsChunk) {
  EXPECT_EQ(event_text_bytes(R"({"id":"cmpl-1","object":"text_completion","model":"m","choices":[)"
                             R"({"index":0,"text":" world","logprobs":null,"finish_reason":null}]})"),
            6u);
}

TEST(ApiTextEstimate, AnthropicDeltas) {
  EXPECT_EQ(event_text_bytes(
                R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello there"}})"),
            11u);
  EXPECT_EQ(
      event_text_bytes(
          R"({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"x\""}})"),
      4u);
  EXPECT_EQ(event_text_bytes(
                R"({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}})"),
            3u);
  EXPECT_EQ(event_text_bytes(
                R"({"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abcd"}})"),
            0u);
}

TEST(ApiTextEstimate, MalformedCountsNothingPastTheBreak) {
  EXPECT_EQ(event_text_bytes(""), 0u);
  EXPECT_EQ(event_text_bytes("[DONE]"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"content":"never closed)"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"content":"ab\)"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"choices":[{"delta":{"content":"\u12)"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"delta")"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"delta":)"), 0u);
  EXPECT_EQ(event_text_bytes(R"({"text":)"), 0u);
}

TEST(ApiTextEstimate, WholeAnswers) {
  // A chat completion: content, reasoning, a tool call's name and arguments; not its role, ids or usage.
  EXPECT_EQ(answer_text_bytes(R"({"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,)"
                              R"("message":{"role":"assistant","content":"Hi there","reasoning_content":"hm",)"
                              R"("tool_calls":[{"id":"call_1","type":"function","function":{"name":"f",)"
                              R"("arguments":"{}"}}]},"logprobs":null,"finish_reason":"stop"}],"usage":null})"),
            8u + 2 + 1 + 2);
  // A completion's choices.
  EXPECT_EQ(answer_text_bytes(R"({"choices":[{"index":0,"text":"abc"},{"index":1,"text":"de"}]})"), 5u);
  // An Anthropic message: text and thinking blocks, a tool_use's name and its input's JSON text.
  EXPECT_EQ(
      answer_text_bytes(R"({"id":"msg_1","type":"message","role":"assistant","model":"c","content":[)"
                        R"({"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"text","text":"Hello"},)"
                        R"({"type":"tool_use","id":"toolu_1","name":"get","input":{"text":"x","n":[1,2]}}],)"
                        R"("stop_reason":"tool_use","usage":{"input_tokens":1}})"),
      3u + 5 + 3 + std::string_view(R"({"text":"x","n":[1,2]})").size());
  // A Responses answer's output.
  EXPECT_EQ(
      answer_text_bytes(R"({"object":"response","output":[{"type":"message","content":[{"type":"output_text",)"
                        R"("text":"Yes","annotations":[]}]},{"type":"function_call","name":"f","arguments":"{}"}]})"),
      3u + 1 + 2);
  EXPECT_EQ(answer_text_bytes(""), 0u);
  EXPECT_EQ(answer_text_bytes("not json"), 0u);
  // Nesting a million deep is a loop, not a stack.
  std::string deep(1'000'000, '[');
  EXPECT_EQ(answer_text_bytes(deep), 0u);
  std::string inputs;
  for (int i = 0; i < 100'000; ++i) inputs += R"({"input":)";
  EXPECT_LE(answer_text_bytes(inputs), inputs.size());
}

std::string chat(std::string_view delta) {
  return std::string(R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[)"
                     R"({"index":0,"delta":)") +
         std::string(delta) + R"(,"logprobs":null,"finish_reason":null}]})";
}

TEST(ApiTextEstimate, AStreamsFrameCountsItsEventsCheaply) {
  std::size_t frame = std::string_view::npos;
  // The first event is read whole: its frame is its data less its text.
  const std::string first = chat(R"({"content":"Hello"})");
  EXPECT_EQ(event_text_bytes(first, frame), 5u);
  EXPECT_EQ(frame, first.size() - 5);
  // Events of the frame and up to kFrameSlack bytes of text: their bytes over it.
  EXPECT_EQ(event_text_bytes(chat(R"({"content":" world"})"), frame), 6u);
  EXPECT_EQ(event_text_bytes(chat(R"({"content":""})"), frame), 0u);
  EXPECT_EQ(event_text_bytes(chat(R"({"content":"12345678"})"), frame), 8u);
  // More (many tokens in one event): read whole, and its frame is the same.
  const std::size_t was = frame;
  EXPECT_EQ(event_text_bytes(chat(R"({"content":")" + std::string(600, 'x') + R"("})"), frame), 600u);
  EXPECT_EQ(frame, was);
  // Escapes read whole are the text they stand for.
  EXPECT_EQ(event_text_bytes(chat(R"({"content":"中中中"})"), frame), 9u);
  // Another shape: a tool call's arguments after text (larger), then text again (smaller), each read whole.
  const std::string args = chat(R"({"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]})");
  EXPECT_EQ(event_text_bytes(args, frame), 2u);
  EXPECT_EQ(frame, args.size() - 2);
  EXPECT_EQ(event_text_bytes(chat(R"({"tool_calls":[{"index":0,"function":{"arguments":"\"a\""}}]})"), frame),
            5u);  // (the cheap path: the bytes on the wire, `\"a\"`; read whole it would be 3)
  EXPECT_EQ(event_text_bytes(chat(R"({"content":"ab"})"), frame), 2u);
  // Reasoning first (vLLM's order), then content: the shorter shape is read whole.
  frame = std::string_view::npos;
  EXPECT_EQ(event_text_bytes(chat(R"({"reasoning_content":"hm"})"), frame), 2u);
  EXPECT_EQ(event_text_bytes(chat(R"({"content":"ok"})"), frame), 2u);
  EXPECT_EQ(event_text_bytes(chat(R"({"content":"yes"})"), frame), 3u);
}

// Text sent escaped or twice: bytes over the frame are not the text's, so each such event is read whole
// (the shortcut counted a CJK character sent as \u4e2d as 6 bytes, vLLM's reasoning sent in both
// reasoning_content and reasoning twice).
TEST(ApiTextEstimate, EscapedOrDoubledTextIsNeverCountedByTheFrame) {
  std::size_t frame = std::string_view::npos;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(event_text_bytes(chat(R"({"content":"\u4e2d"})"), frame), 3u) << i;
    EXPECT_EQ(frame, std::string_view::npos);
  }
  frame = std::string_view::npos;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(event_text_bytes(chat(R"({"reasoning_content":" cat","reasoning":" cat"})"), frame), 4u) << i;
    EXPECT_EQ(frame, std::string_view::npos);
  }
  // Plain text after them: the shortcut again.
  EXPECT_EQ(event_text_bytes(chat(R"({"content":"ab"})"), frame), 2u);
  EXPECT_NE(frame, std::string_view::npos);
  EXPECT_EQ(event_text_bytes(chat(R"({"content":"abc"})"), frame), 3u);
}

TEST(ApiTextEstimate, TokensAtFourBytes) {
  EXPECT_EQ(text_tokens(0), 0u);
  EXPECT_EQ(text_tokens(1), 1u);
  EXPECT_EQ(text_tokens(4), 1u);
  EXPECT_EQ(text_tokens(5), 2u);
  EXPECT_EQ(text_tokens(400), 100u);
}

}  // namespace
}  // namespace weir::api
