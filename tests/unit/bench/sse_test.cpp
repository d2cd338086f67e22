#include "bench/lib/sse.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

namespace weir::bench {
namespace {

std::string chunk(std::string_view content) {
  return std::string(
             R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":")") +
         std::string(content) + R"("},"logprobs":null,"finish_reason":null}]})";
}

// A vLLM-shaped stream: role chunk, `n` content chunks, finish chunk, usage chunk, [DONE].
std::vector<std::string> recorded_events(int n) {
  std::vector<std::string> ev;
  ev.push_back(
      R"({"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})");
  for (int i = 0; i < n; ++i) ev.push_back(chunk("tok" + std::to_string(i) + " \\\"q\\\""));
  ev.push_back(R"({"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"finish_reason":"length"}]})");
  ev.push_back(
      R"({"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":412,"total_tokens":540,"completion_tokens":128}})");
  ev.push_back("[DONE]");
  return ev;
}

std::string frame(const std::string& data, std::string_view eol) {
  return "data: " + data + std::string(eol) + std::string(eol);
}

TEST(BenchSseParser, LineEndingsAndFields) {
  SseParser p;
  std::vector<std::pair<std::string, std::string>> got;
  auto cb = [&](std::string_view t, std::string_view d) { got.emplace_back(t, d); };
  p.feed(
      "\xEF\xBB\xBF"
      "data: a\r\n\r\n",
      cb);
  p.feed(": comment\n\ndata:b\rdata:  c\r\revent: x\ndata\n\n", cb);
  p.feed("id: 1\nretry: 5\n\n", cb);  // no data: not dispatched
  p.feed("data: [DONE]\n\n", cb);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], (std::pair<std::string, std::string>{"", "a"}));
  EXPECT_EQ(got[1], (std::pair<std::string, std::string>{"", "b\n c"}));
  EXPECT_EQ(got[2], (std::pair<std::string, std::string>{"x", ""}));
  EXPECT_EQ(got[3], (std::pair<std::string, std::string>{"", "[DONE]"}));
}

TEST(BenchSseParser, CrLfSplitAcrossFeedsIsOneBreak) {
  SseParser p;
  int events = 0;
  auto cb = [&](std::string_view, std::string_view d) {
    ++events;
    EXPECT_EQ(d, "x");
  };
  p.feed("data: x\r", cb);
  p.feed("\n\r", cb);
  p.feed("\n", cb);
  EXPECT_EQ(events, 1);
  p.feed("data: x\r", cb);  // CR then CR: two breaks, an event
  p.feed("\r", cb);
  EXPECT_EQ(events, 2);
}

TEST(BenchScanJson, ContentRules) {
  EXPECT_TRUE(scan_json(chunk("hi")).has_content);
  EXPECT_FALSE(scan_json(chunk("")).has_content);
  EXPECT_FALSE(scan_json(R"({"choices":[{"delta":{"role":"assistant"}}]})").has_content);
  EXPECT_FALSE(scan_json(R"({"choices":[{"delta":{"content":null}}]})").has_content);
  EXPECT_TRUE(scan_json(R"({"choices":[{"text":"x","index":0}]})").has_content);
  EXPECT_TRUE(scan_json(R"({"choices":[{"delta":{"reasoning_content":"x"}}]})").has_content);
  EXPECT_TRUE(scan_json(R"({"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}})").has_content);
  // A key-like text inside a string value is not a key.
  EXPECT_FALSE(scan_json(R"({"note":"\"content\":\"x\"","delta":{}})").has_content);
  EXPECT_FALSE(scan_json(R"({"note":"a \\","content": ""})").has_content);
  EXPECT_TRUE(scan_json(R"({"note":"a \\","content" : "y"})").has_content);
  const auto u = scan_json(R"({"choices":[],"usage":{"prompt_tokens":412,"completion_tokens":128}})");
  EXPECT_EQ(u.completion_tokens, 128);
  EXPECT_EQ(u.prompt_tokens, 412);
  EXPECT_FALSE(u.has_content);
  EXPECT_TRUE(scan_json(R"({"error":{"message":"overloaded"}})").is_error);
  EXPECT_FALSE(scan_json(R"({"id":"x","error":null})").is_error);
}

// weir-mock --stamp's "mock_ns": read wherever the member is, -1 when absent, and the first token's value is
// the stream's (a later token's stamp, or the role chunk's, does not replace it).
TEST(BenchScanJson, MockStamp) {
  EXPECT_EQ(scan_json(R"({"mock_ns":20005123,"id":"c","choices":[{"delta":{"content":"a"}}]})").mock_ns, 20005123);
  EXPECT_EQ(scan_json(R"({"id":"c","choices":[{"delta":{"content":"a"}}]})").mock_ns, -1);
  EXPECT_EQ(scan_json(R"({"note":"\"mock_ns\":5","id":"c"})").mock_ns, -1);  // inside a string: no member
  StreamTracker tr;
  tr.start(nullptr, 0);
  tr.feed("data: {\"mock_ns\":7,\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", 10);
  tr.feed("data: {\"mock_ns\":20000000,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", 20);
  tr.feed("data: {\"mock_ns\":25000000,\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n", 30);
  EXPECT_EQ(tr.stats().first_token_ns, 20);
  EXPECT_EQ(tr.stats().first_token_mock_ns, 20'000'000);
}

struct Timed {
  std::string bytes;
  std::int64_t at_ns;
};

// Builds the recorded stream as (bytes, arrival time) pieces: the role chunk
// at 90 ms, token i at 90 + 14·i ms, the tail with the last token.
std::vector<Timed> recorded_stream(int n, std::string_view eol) {
  const auto ev = recorded_events(n);
  std::vector<Timed> out;
  std::int64_t t = 90'000'000;
  out.push_back({frame(ev[0], eol), t});
  for (int i = 0; i < n; ++i) {
    out.push_back({frame(ev[1 + i], eol), t});
    t += 14'000'000;
  }
  t -= 14'000'000;
  std::string tail;
  for (std::size_t i = 1 + n; i < ev.size(); ++i) tail += frame(ev[i], eol);
  out.push_back({tail, t});
  return out;
}

// Feeds each timed piece cut at random places (every cut piece arrives at its piece's time).
void feed_split(StreamTracker& tr, const std::vector<Timed>& stream, std::mt19937& rng) {
  for (const auto& piece : stream) {
    std::size_t pos = 0;
    while (pos < piece.bytes.size()) {
      const std::size_t len = 1 + rng() % 40;
      tr.feed(std::string_view(piece.bytes).substr(pos, len), piece.at_ns);
      pos += len;
    }
  }
}

TEST(BenchStreamTracker, TimingsFromARecordedStreamInArbitrarySplits) {
  for (std::string_view eol : {"\n", "\r\n", "\r"}) {
    for (unsigned seed = 0; seed < 50; ++seed) {
      std::mt19937 rng(seed);
      Histogram itl;
      StreamTracker tr;
      tr.start(&itl, 1'000'000'000);
      feed_split(tr, recorded_stream(128, eol), rng);
      const auto& s = tr.stats();
      EXPECT_EQ(s.tokens, 128u);
      EXPECT_EQ(s.first_token_ns, 90'000'000);  // the role chunk is not a token
      EXPECT_EQ(s.last_token_ns, 90'000'000 + 127 * 14'000'000);
      EXPECT_EQ(s.usage_completion_tokens, 128);
      EXPECT_EQ(s.usage_prompt_tokens, 412);
      EXPECT_TRUE(s.done);
      EXPECT_FALSE(tr.truncated());
      EXPECT_FALSE(s.stalled);
      EXPECT_EQ(s.max_gap_ns, 14'000'000);
      EXPECT_EQ(s.events, 128u + 4u);
      ASSERT_EQ(itl.count(), 127u);
      EXPECT_EQ(itl.min(), 14'000'000);
      EXPECT_EQ(itl.max(), 14'000'000);
    }
  }
}

TEST(BenchStreamTracker, TokensArrivingTogetherHaveZeroGap) {
  Histogram itl;
  StreamTracker tr;
  tr.start(&itl, 0);
  std::string all;
  for (int i = 0; i < 3; ++i) all += frame(chunk("x"), "\n");
  tr.feed(all, 5);
  EXPECT_EQ(tr.stats().tokens, 3u);
  EXPECT_EQ(itl.count(), 2u);
  EXPECT_EQ(itl.max(), 0);
  EXPECT_TRUE(tr.truncated());
}

TEST(BenchStreamTracker, TruncationAndStall) {
  std::mt19937 rng(1);
  auto stream = recorded_stream(10, "\n");
  stream.pop_back();                 // lose usage and [DONE]
  stream[5].at_ns += 2'000'000'000;  // a 2 s gap before token 4 ...
  for (std::size_t i = 6; i < stream.size(); ++i) stream[i].at_ns += 2'000'000'000;
  Histogram itl;
  StreamTracker tr;
  tr.start(&itl, 1'000'000'000);
  feed_split(tr, stream, rng);
  EXPECT_TRUE(tr.truncated());
  EXPECT_TRUE(tr.stats().stalled);
  EXPECT_EQ(tr.stats().tokens, 10u);  // only finish, usage and [DONE] were lost
  EXPECT_EQ(tr.stats().max_gap_ns, 2'014'000'000);
  EXPECT_EQ(tr.stats().usage_completion_tokens, -1);
}

TEST(BenchStreamTracker, PartialLastEventDoesNotCount) {
  StreamTracker tr;
  tr.start(nullptr, 0);
  tr.feed(frame(chunk("a"), "\n"), 1);
  tr.feed("data: [DONE]\n", 2);  // the blank line never came
  EXPECT_TRUE(tr.truncated());
  EXPECT_EQ(tr.stats().tokens, 1u);
}

TEST(BenchStreamTracker, ErrorEventsAndAnthropicEnd) {
  StreamTracker tr;
  tr.start(nullptr, 0);
  tr.feed("data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n", 1);
  EXPECT_TRUE(tr.stats().stream_error);

  tr.start(nullptr, 0);
  tr.feed(
      "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
      "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
      7);
  tr.feed(
      "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":1}}\n\n"
      "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
      8);
  EXPECT_FALSE(tr.truncated());
  EXPECT_EQ(tr.stats().tokens, 1u);
  EXPECT_EQ(tr.stats().first_token_ns, 7);
  EXPECT_EQ(tr.stats().usage_completion_tokens, 1);
}

TEST(BenchStreamTracker, ResponsesEventsTokensAndEnd) {
  StreamTracker tr;
  tr.start(nullptr, 0);
  tr.feed(
      "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"text\":{\"format\":{\"type\":"
      "\"text\"}},\"usage\":null},\"sequence_number\":0}\n\n"
      "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\","
      "\"sequence_number\":1}\n\n",
      5);
  tr.feed(
      "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"!\","
      "\"sequence_number\":2}\n\n"
      "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"Hi!\","
      "\"sequence_number\":3}\n\n",
      6);
  EXPECT_TRUE(tr.truncated());
  tr.feed(
      "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"content\":"
      "[{\"text\":\"Hi!\"}]}],\"usage\":{\"input_tokens\":4,\"output_tokens\":2}},\"sequence_number\":4}\n\n",
      7);
  EXPECT_FALSE(tr.truncated());
  EXPECT_EQ(tr.stats().tokens, 2u);  // the deltas; not the .done text nor the final snapshot
  EXPECT_EQ(tr.stats().first_token_ns, 5);
  EXPECT_EQ(tr.stats().usage_completion_tokens, 2);
  EXPECT_EQ(tr.stats().usage_prompt_tokens, 4);
  tr.start(nullptr, 0);
  tr.feed("event: response.failed\ndata: {\"type\":\"response.failed\"}\n\n", 1);
  EXPECT_TRUE(tr.stats().stream_error);
}

TEST(BenchStreamTracker, NothingCountsAfterDone) {
  StreamTracker tr;
  tr.start(nullptr, 0);
  tr.feed("data: [DONE]\n\n" + frame(chunk("late"), "\n"), 3);
  EXPECT_FALSE(tr.truncated());
  EXPECT_EQ(tr.stats().tokens, 0u);
}

}  // namespace
}  // namespace weir::bench
