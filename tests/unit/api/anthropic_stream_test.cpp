// OpenAI/vLLM chunks → Anthropic stream events: the grammar (one
// message_start, dense block indices, one message_delta and message_stop),
// thinking, parallel tool calls, repeated terminal chunks, [DONE], in-stream
// errors, and a stream split at every byte through the SSE reader.
#include "api/anthropic/stream.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <vector>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "http/sse.hpp"

namespace weir::api::anthropic {
namespace {

namespace json = boost::json;

struct Event {
  std::string type;
  json::value data;
};

// Parses `event: T\ndata: J\n\n` blocks, checking the framing. A message_start is followed by a ping
// (Anthropic's `{"type": "ping"}`, byte for byte), which is checked and left out of the result.
std::vector<Event> events_of(std::string_view s) {
  std::vector<Event> out;
  constexpr std::string_view kPing = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
  bool pinged = false;
  while (!s.empty()) {
    if (!pinged && !out.empty() && out.back().type == "message_start") {
      pinged = true;
      EXPECT_TRUE(s.starts_with(kPing)) << s;
      if (s.starts_with(kPing)) s.remove_prefix(kPing.size());
      if (s.empty()) break;
    }
    const auto end = s.find("\n\n");
    EXPECT_NE(end, std::string_view::npos) << s;
    if (end == std::string_view::npos) break;
    const std::string_view block = s.substr(0, end);
    s.remove_prefix(end + 2);
    const auto nl = block.find('\n');
    EXPECT_TRUE(block.starts_with("event: ")) << block;
    EXPECT_TRUE(block.substr(nl + 1).starts_with("data: ")) << block;
    Event e{std::string(block.substr(7, nl - 7)), json::parse(block.substr(nl + 7))};
    EXPECT_EQ(e.data.at("type"), e.type.c_str());
    out.push_back(std::move(e));
  }
  return out;
}

std::string run(const std::vector<std::string_view>& chunks, bool finish = true) {
  StreamTranslator t;
  t.reset();
  std::string out;
  for (auto c : chunks) t.on_data(c, out);
  if (finish) t.finish(out);
  return out;
}

// The Anthropic grammar: one message_start first, blocks opened, deltaed and
// closed in order with indices 0, 1, 2…, then one message_delta, one message_stop.
void expect_grammar(const std::vector<Event>& ev) {
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.front().type, "message_start");
  EXPECT_EQ(ev[ev.size() - 2].type, "message_delta");
  EXPECT_EQ(ev.back().type, "message_stop");
  std::int64_t open = -1;
  std::int64_t next = 0;
  for (std::size_t i = 1; i + 2 < ev.size(); ++i) {
    const auto& e = ev[i];
    const auto index = e.data.at("index").as_int64();
    if (e.type == "content_block_start") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(index, next);
      open = index;
    } else if (e.type == "content_block_delta") {
      EXPECT_EQ(index, open);
    } else {
      EXPECT_EQ(e.type, "content_block_stop");
      EXPECT_EQ(index, open);
      open = -1;
      ++next;
    }
  }
  EXPECT_EQ(open, -1);
}

constexpr std::string_view kRole =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"mock-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})";
constexpr std::string_view kTok1 =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"mock-model","choices":[{"index":0,"delta":{"content":" river"},"logprobs":null,"finish_reason":null}]})";
constexpr std::string_view kTok2 =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"mock-model","choices":[{"index":0,"delta":{"content":" stone"},"logprobs":null,"finish_reason":"length","stop_reason":null}]})";
constexpr std::string_view kUsage =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"mock-model","choices":[],"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2}})";

TEST(AnthropicStream, TextStream) {
  const auto ev = events_of(run({kRole, kTok1, kTok2, kUsage, "[DONE]"}));
  expect_grammar(ev);
  ASSERT_EQ(ev.size(), 7u);
  EXPECT_EQ(ev[0].data.at("message"), json::parse(R"({"id":"msg_r1","type":"message","role":"assistant",
    "model":"mock-model","content":[],"stop_reason":null,"stop_sequence":null,
    "usage":{"input_tokens":0,"output_tokens":0,"cache_read_input_tokens":0}})"));
  EXPECT_EQ(ev[1].data.at("content_block"), json::parse(R"({"type":"text","text":""})"));
  EXPECT_EQ(ev[2].data.at("delta"), json::parse(R"({"type":"text_delta","text":" river"})"));
  EXPECT_EQ(ev[3].data.at("delta"), json::parse(R"({"type":"text_delta","text":" stone"})"));
  EXPECT_EQ(ev[5].data,
            json::parse(R"({"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},
    "usage":{"input_tokens":9,"output_tokens":2,"cache_read_input_tokens":0}})"));
}

TEST(AnthropicStream, APaddedDoneIsTheEndToo) {
  // As on the plain relay (core::is_sse_done): trailing spaces or tabs.
  const auto ev = events_of(run({kRole, kTok1, kTok2, kUsage, "[DONE] \t "}));
  expect_grammar(ev);
  ASSERT_EQ(ev.size(), 7u);
  EXPECT_EQ(ev.back().type, "message_stop");
}

TEST(AnthropicStream, RepeatedFinishAndUsageGiveOneTerminal) {
  const std::string out = run({kRole, kTok1, kTok2, kTok2, kUsage, kUsage, "[DONE]", "[DONE]"});
  const auto ev = events_of(out);
  expect_grammar(ev);
  EXPECT_EQ(out.find("[DONE]"), std::string::npos);
  int deltas = 0;
  for (const auto& e : ev) deltas += e.type == "message_delta";
  EXPECT_EQ(deltas, 1);
}

TEST(AnthropicStream, NoUsageChunkEndsAtDone) {
  const auto ev = events_of(run({kRole, kTok1, kTok2, "[DONE]"}, false));
  expect_grammar(ev);
  EXPECT_EQ(ev[ev.size() - 2].data.at("usage").at("output_tokens"), 0);
}

TEST(AnthropicStream, ThinkingThenTextThenParallelTools) {
  const auto ev = events_of(run({
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Hmm"}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"reasoning_content":" ok"}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"content":"Sure."}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-a","type":"function","index":0,"function":{"name":"get_weather"}}]}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"type":"function","index":1,"function":{"name":"get_time","arguments":"{}"}}]}}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls","stop_reason":null}]})",
      R"({"id":"chatcmpl-t","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}})",
      "[DONE]",
  }));
  expect_grammar(ev);
  std::vector<std::string> starts;
  for (const auto& e : ev)
    if (e.type == "content_block_start") starts.push_back(json::serialize(e.data.at("content_block")));
  ASSERT_EQ(starts.size(), 4u);
  EXPECT_EQ(json::parse(starts[0]), json::parse(R"({"type":"thinking","thinking":"","signature":""})"));
  EXPECT_EQ(json::parse(starts[1]), json::parse(R"({"type":"text","text":""})"));
  EXPECT_EQ(json::parse(starts[2]),
            json::parse(R"({"type":"tool_use","id":"chatcmpl-tool-a","name":"get_weather","input":{}})"));
  EXPECT_EQ(json::parse(starts[3]),
            json::parse(R"({"type":"tool_use","id":"toolu_t_1","name":"get_time","input":{}})"));
  std::string args;
  for (const auto& e : ev)
    if (e.type == "content_block_delta" && e.data.at("index") == 2)
      args += e.data.at("delta").at("partial_json").as_string().c_str();
  EXPECT_EQ(json::parse(args), json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(ev[ev.size() - 2].data.at("delta").at("stop_reason"), "tool_use");
}

// The blocks (type and text) a stream gives, the translator set up with `with_thinking`.
std::vector<std::pair<std::string, std::string>> blocks_of(const std::vector<std::string_view>& chunks,
                                                           bool with_thinking) {
  StreamTranslator t;
  t.reset({}, StreamTranslator::kHeldLimit, with_thinking);
  std::string out;
  for (auto c : chunks) t.on_data(c, out);
  t.finish(out);
  const auto ev = events_of(out);
  expect_grammar(ev);
  std::vector<std::pair<std::string, std::string>> blocks;
  for (const auto& e : ev) {
    if (e.type == "content_block_start")
      blocks.emplace_back(e.data.at("content_block").at("type").as_string().c_str(), "");
    if (e.type == "content_block_delta") {
      const auto& d = e.data.at("delta").as_object();
      blocks.back().second +=
          d.contains("text") ? d.at("text").as_string().c_str() : d.at("thinking").as_string().c_str();
    }
  }
  EXPECT_EQ(ev[ev.size() - 2].data.at("usage").at("output_tokens"), 9);  // (its tokens are charged either way)
  return blocks;
}

using Blocks = std::vector<std::pair<std::string, std::string>>;

// Mistral's API streams delta.content as a list of parts (text; magistral's thinking first): each part as it
// comes, never dropped; parts of other types skipped.
TEST(AnthropicStream, ContentPartsAreTextAndThinking) {
  const std::vector<std::string_view> chunks = {
      R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
      R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"delta":{"content":[{"type":"thinking","thinking":[{"type":"text","text":"Let me"}]}]}}]})",
      R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"delta":{"content":[{"type":"thinking","thinking":" see"}]}}]})",
      R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"delta":{"content":[{"type":"text","text":"The answer"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":" is 42."}]}}]})",
      R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"delta":{"content":[]}}]})",
      R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})",
      R"({"id":"chatcmpl-p","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}})",
      "[DONE]"};
  EXPECT_EQ(blocks_of(chunks, true), (Blocks{{"thinking", "Let me see"}, {"text", "The answer is 42."}}));
  EXPECT_EQ(blocks_of(chunks, false), (Blocks{{"text", "The answer is 42."}}));
}

// Anthropic gives thinking blocks only when the request enabled thinking: a reasoning model's server (vLLM with a
// reasoning parser) sends reasoning_content (or `reasoning`) always, which is then left out.
TEST(AnthropicStream, ReasoningIsAThinkingBlockOnlyWhenAsked) {
  const std::vector<std::string_view> chunks = {
      R"({"id":"chatcmpl-q","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
      R"({"id":"chatcmpl-q","model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Hmm"}}]})",
      R"({"id":"chatcmpl-q","model":"m","choices":[{"index":0,"delta":{"reasoning":" ok"}}]})",
      R"({"id":"chatcmpl-q","model":"m","choices":[{"index":0,"delta":{"content":"Answer"}}]})",
      R"({"id":"chatcmpl-q","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})",
      R"({"id":"chatcmpl-q","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}})",
      "[DONE]"};
  EXPECT_EQ(blocks_of(chunks, true), (Blocks{{"thinking", "Hmm ok"}, {"text", "Answer"}}));
  EXPECT_EQ(blocks_of(chunks, false), (Blocks{{"text", "Answer"}}));
}

TEST(AnthropicStream, ParallelToolCallsWithoutIndexAreToldApartByTheirIds) {
  // Some OpenAI-compatible servers give no `index`: a new id starts the next call, an entry without one
  // continues the open call.
  const auto ev = events_of(run({
      R"({"id":"chatcmpl-n","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]}}]})",
      R"({"id":"chatcmpl-n","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"{\"city\": \"Paris\"}"}}]}}]})",
      R"({"id":"chatcmpl-n","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\""}}]}}]})",
      R"({"id":"chatcmpl-n","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_b","function":{"arguments":": \"CET\"}"}}]}}]})",
      R"({"id":"chatcmpl-n","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  expect_grammar(ev);
  std::vector<json::value> starts;
  std::map<std::int64_t, std::string> args;
  for (const auto& e : ev) {
    if (e.type == "content_block_start") starts.push_back(e.data.at("content_block"));
    if (e.type == "content_block_delta")
      args[e.data.at("index").as_int64()] += e.data.at("delta").at("partial_json").as_string().c_str();
  }
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0], json::parse(R"({"type":"tool_use","id":"call_a","name":"get_weather","input":{}})"));
  EXPECT_EQ(starts[1], json::parse(R"({"type":"tool_use","id":"call_b","name":"get_time","input":{}})"));
  EXPECT_EQ(json::parse(args[0]), json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(json::parse(args[1]), json::parse(R"({"tz":"CET"})"));
}

TEST(AnthropicStream, AToolCallCutOffByMaxTokensIsMaxTokens) {
  const auto ev = events_of(run({
      R"({"id":"chatcmpl-c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"t1","type":"function","index":0,"function":{"name":"f","arguments":"{\"city\": \"Par"}}]}}]})",
      R"({"id":"chatcmpl-c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length","stop_reason":null}]})",
      "[DONE]",
  }));
  expect_grammar(ev);
  EXPECT_EQ(ev[ev.size() - 2].data.at("delta").at("stop_reason"), "max_tokens");
}

TEST(AnthropicStream, ToolArgumentsThatAreNoObjectArriveAsRaw) {
  // A tool_use input is an object: arguments that begin otherwise (a list, a
  // string) are held and given whole at the block's end as {"_raw": text},
  // as the non-streamed translation gives them; an object streams as it comes.
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"t1","index":0,"function":{"name":"f","arguments":" [1,"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"2]"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"t2","index":1,"function":{"name":"g","arguments":" "}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"a\":"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"1}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  expect_grammar(ev);
  std::vector<std::string> partials[2];
  for (const auto& e : ev)
    if (e.type == "content_block_delta")
      partials[e.data.at("index").as_int64()].emplace_back(e.data.at("delta").at("partial_json").as_string());
  ASSERT_EQ(partials[0].size(), 1u);
  EXPECT_EQ(json::parse(partials[0][0]), json::parse(R"({"_raw":" [1,2]"})"));
  // (Call 1 began while call 0 was open: it is held, and given whole in one delta when the calls end.)
  EXPECT_EQ(partials[1], (std::vector<std::string>{"{\"a\":1}"}));
}

TEST(AnthropicStream, StopSequence) {
  const auto ev = events_of(run({
      R"({"id":"chatcmpl-s","model":"m","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop","stop_reason":"END"}]})",
      "[DONE]",
  }));
  expect_grammar(ev);
  EXPECT_EQ(ev[ev.size() - 2].data.at("delta"),
            json::parse(R"({"stop_reason":"stop_sequence","stop_sequence":"END"})"));
}

TEST(AnthropicStream, InterleavedToolDeltasCutShortAreAnError) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]})",
  }));
  EXPECT_EQ(ev.back().type, "error");
  EXPECT_EQ(ev.back().data.at("error").at("type"), "api_error");
  // No call was stopped: a client never saw one end before it was complete.
  for (const auto& e : ev) EXPECT_NE(e.type, "content_block_stop");
}

// The tool_use blocks of a stream: {index: [id, name, the partial_json joined]}.
std::map<std::int64_t, std::vector<std::string>> tool_blocks(const std::vector<Event>& ev) {
  std::map<std::int64_t, std::vector<std::string>> blocks;
  for (const auto& e : ev) {
    if (e.type == "content_block_start" && e.data.at("content_block").at("type") == "tool_use")
      blocks[e.data.at("index").as_int64()] = {std::string(e.data.at("content_block").at("id").as_string()),
                                               std::string(e.data.at("content_block").at("name").as_string()), ""};
    if (e.type == "content_block_delta" && e.data.at("delta").at("type") == "input_json_delta")
      blocks[e.data.at("index").as_int64()][2] += e.data.at("delta").at("partial_json").as_string();
  }
  return blocks;
}

TEST(AnthropicStream, InterleavedToolDeltasAreHeldAndGivenInOrder) {
  // Call 0 starts, call 1 starts, then each one's arguments (bifrost#1829's shape): call 0 keeps streaming,
  // call 1 is held and given whole (start, its arguments, stop) when the calls end.
  const auto out = run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"get_weather","arguments":""}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"get_time","arguments":""}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"tz\":\"UTC\"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  });
  const auto ev = events_of(out);
  expect_grammar(ev);
  const auto blocks = tool_blocks(ev);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks.at(0), (std::vector<std::string>{"a", "get_weather", R"({"city":"Paris"})"}));
  EXPECT_EQ(blocks.at(1), (std::vector<std::string>{"b", "get_time", R"({"tz":"UTC"})"}));
  EXPECT_EQ(ev[ev.size() - 2].data.at("delta").at("stop_reason"), "tool_use");
}

TEST(AnthropicStream, TwentyThousandToolCallsInterleavedAreGivenWholeInOrder) {
  // 20,000 calls begun one after another (all but the first held), then each one's arguments in reverse
  // order: each entry is routed by a map, held calls are released by a cursor (linear scans per entry were
  // quadratic: 5.7 s of one worker's CPU per stream at 64,000 calls).
  constexpr int kCalls = 20000;
  std::vector<std::string> chunks;
  constexpr std::string_view kHead = R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[)";
  constexpr std::string_view kTail = "]}}]}";
  for (int i = 0; i < kCalls; ++i)
    chunks.push_back(fmt::format(R"({}{{"index":{},"id":"toolu_{}","function":{{"name":"f{}","arguments":""}}}}{})",
                                 kHead, i, i, i, kTail));
  for (int i = kCalls; i-- > 0;)
    chunks.push_back(
        fmt::format(R"({}{{"index":{},"function":{{"arguments":"{{\"n\":{}}}"}}}}{})", kHead, i, i, kTail));
  chunks.emplace_back(R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})");
  chunks.emplace_back("[DONE]");
  const auto ev = events_of(run(std::vector<std::string_view>(chunks.begin(), chunks.end())));
  expect_grammar(ev);
  const auto blocks = tool_blocks(ev);
  ASSERT_EQ(blocks.size(), static_cast<std::size_t>(kCalls));
  for (int i = 0; i < kCalls; ++i)
    EXPECT_EQ(blocks.at(i), (std::vector<std::string>{fmt::format("toolu_{}", i), fmt::format("f{}", i),
                                                      fmt::format(R"({{"n":{}}})", i)}));
  EXPECT_EQ(ev[ev.size() - 2].data.at("delta").at("stop_reason"), "tool_use");
}

TEST(AnthropicStream, AToolNameIsWholeInItsStartWhateverItsPieces) {
  // The name's second piece with the arguments ("get_", "weather"): content_block_start waits for it; a name
  // repeated whole in every chunk ("f", "f") is f; "null" and whitespace arguments are no arguments (input {}).
  const auto out = run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"get_","arguments":"{\"a\":"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"weather","arguments":"1}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"f","arguments":"{"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"n","function":{"name":"g","arguments":"null"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"w","function":{"name":"h","arguments":" "}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  });
  const auto ev = events_of(out);
  expect_grammar(ev);
  const auto blocks = tool_blocks(ev);
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blocks.at(0), (std::vector<std::string>{"a", "get_weather", R"({"a":1})"}));
  EXPECT_EQ(blocks.at(1), (std::vector<std::string>{"b", "f", "{}"}));
  EXPECT_EQ(blocks.at(2), (std::vector<std::string>{"n", "g", ""}));
  EXPECT_EQ(blocks.at(3), (std::vector<std::string>{"w", "h", ""}));
}

TEST(AnthropicStream, ANamePieceAfterTheArgumentsStreamedFailsTheStream) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a\":"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"g","arguments":"1}"}}]}}]})",
  }));
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().type, "error");
  EXPECT_EQ(tool_blocks(ev).at(0)[1], "f");
}

TEST(AnthropicStream, HeldToolCallsPastTheLimitFailTheStream) {
  StreamTranslator t;
  t.reset("req-1", 7);  // ("g" and {"x":1} are 8 bytes)
  std::string out;
  t.on_data(
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}}]}}]})",
      out);
  t.on_data(
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{\"x\":1}"}}]}}]})",
      out);
  const auto ev = events_of(out);
  EXPECT_EQ(ev.back().type, "error");
  EXPECT_NE(std::string(ev.back().data.at("error").at("message").as_string()).find("server.max_response"),
            std::string::npos);
  EXPECT_TRUE(t.failed());
}

TEST(AnthropicStream, ANewIdOnTheOpenIndexStartsANewCall) {
  // Ollama sends every call of a turn as index 0, each with its own id.
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_2","function":{"name":"get_time","arguments":"{"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  expect_grammar(ev);
  const auto blocks = tool_blocks(ev);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks.at(0), (std::vector<std::string>{"call_1", "get_weather", R"({"city":"Paris"})"}));
  EXPECT_EQ(blocks.at(1), (std::vector<std::string>{"call_2", "get_time", "{}"}));
  // The first call ended when the second began (its index was taken): its stop came before the second's start.
  std::vector<std::string> order;
  for (const auto& e : ev)
    if (e.type == "content_block_start" || e.type == "content_block_stop") order.push_back(e.type);
  EXPECT_EQ(order, (std::vector<std::string>{"content_block_start", "content_block_stop", "content_block_start",
                                             "content_block_stop"}));
}

// An in-band context-length refusal (vLLM checks before the stream, but a server in front may not): in
// Anthropic's words, as the whole answer's.
TEST(AnthropicStream, InBandContextLengthRefusalInAnthropicsWords) {
  const auto ev = events_of(run(
      {R"({"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 100 output tokens and your prompt contains 4900 input tokens, for a total of 5000 tokens.","type":"BadRequestError","code":400}})"}));
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().type, "error");
  EXPECT_EQ(ev.back().data.at("error").at("type"), "invalid_request_error");
  EXPECT_EQ(ev.back().data.at("error").at("message"), "prompt is too long: 4900 tokens > 4096 maximum");
}

TEST(AnthropicStream, ToolArgumentsThatAreNoJsonFailUnlessCutByLength) {
  const std::vector<std::string_view> chunks = {
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"a\": "}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"tru"}}]}}]})",
  };
  auto with = [&](std::string_view finish_chunk) {
    auto c = chunks;
    c.push_back(finish_chunk);
    c.push_back("[DONE]");
    return events_of(run(c));
  };
  auto ev = with(R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})");
  EXPECT_EQ(ev.back().type, "error");
  EXPECT_EQ(ev.back().data.at("error").at("type"), "api_error");
  for (const auto& e : ev) EXPECT_NE(e.type, "message_stop");
  // Cut by max_tokens: the stop reason says the input is incomplete.
  ev = with(R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]})");
  expect_grammar(ev);
  EXPECT_EQ(ev[ev.size() - 2].data.at("delta").at("stop_reason"), "max_tokens");
  // Text that is no object and no JSON either ("tru"): an error too.
  ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"tru"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  EXPECT_EQ(ev.back().type, "error");
}

// Only the call the limit cut (the last block) is exempt under "length": an earlier call's garbled input was
// whole when the model went on, so the stream fails as it would without the limit (the later call held).
TEST(AnthropicStream, AnEarlierCallWithGarbledArgumentsFailsUnderLengthToo) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"r\": tru"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{\"tz\": \"U"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]})",
      "[DONE]",
  }));
  EXPECT_EQ(ev.back().type, "error");
  for (const auto& e : ev) EXPECT_NE(e.type, "message_stop");
}

TEST(AnthropicStream, EmptyDataEventsAreSkipped) {
  const auto ev =
      events_of(run({kRole, "", " ", kTok1, "",
                     R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})", "[DONE]"}));
  expect_grammar(ev);
  EXPECT_EQ(ev[ev.size() - 2].data.at("delta").at("stop_reason"), "end_turn");
}

TEST(AnthropicStream, NoUpstreamIdTakesTheRequestId) {
  for (std::string_view id : {R"("id":"",)", R"("id":"chatcmpl-",)", ""}) {
    const std::string chunk = fmt::format(
        R"({{{}"model":"m","choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"name":"f","arguments":"{{}}"}}}}]}},"finish_reason":"tool_calls"}}]}})",
        id);
    StreamTranslator t;
    t.reset("req-42");
    std::string out;
    t.on_data(chunk, out);
    t.on_data("[DONE]", out);
    const auto ev = events_of(out);
    expect_grammar(ev);
    EXPECT_EQ(ev[0].data.at("message").at("id"), "msg_req-42") << id;
    EXPECT_EQ(tool_blocks(ev).at(0).at(0), "toolu_req-42_0") << id;
  }
}

TEST(AnthropicStream, UpstreamErrorsAndEarlyEnds) {
  // vLLM's in-stream error.
  auto ev = events_of(
      run({kRole, kTok1, R"({"error":{"message":"engine dead","type":"InternalServerError","code":500}})", "[DONE]"}));
  EXPECT_EQ(ev.back().type, "error");
  EXPECT_EQ(ev.back().data.at("error"), json::parse(R"({"type":"api_error","message":"engine dead"})"));
  // The body ended without a finish_reason.
  ev = events_of(run({kRole, kTok1}));
  EXPECT_EQ(ev.back().type, "error");
  // A failure reported by the gateway after the head went out: one error event, then nothing.
  StreamTranslator t;
  std::string out;
  t.on_data(kRole, out);
  t.fail(504, "timed out", out);
  t.fail(504, "timed out", out);
  t.on_data(kTok1, out);
  t.finish(out);
  ev = events_of(out);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1].data.at("error").at("message"), "timed out");
  EXPECT_TRUE(t.ended());
  // Nothing at all before [DONE].
  ev = events_of(run({"[DONE]"}));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, "error");
}

TEST(AnthropicStream, SplitAnywhereGivesTheSameEvents) {
  std::string wire;
  for (auto c : {kRole, kTok1, kTok2, kUsage, std::string_view("[DONE]")}) http::append_sse_data(wire, c);
  const std::string want = run({kRole, kTok1, kTok2, kUsage, "[DONE]"});
  for (std::size_t cut = 1; cut < wire.size(); ++cut) {
    http::SseReader reader;
    StreamTranslator t;
    std::string out;
    for (std::string_view part : {std::string_view(wire).substr(0, cut), std::string_view(wire).substr(cut)}) {
      reader.push(part);
      while (auto ev = reader.next())
        if (ev->has_data) t.on_data(ev->data, out);
    }
    t.finish(out);
    ASSERT_EQ(out, want) << "cut at " << cut;
  }
}

TEST(AnthropicStream, ToolIdsWeirMakesAreIdsAnthropicTakes) {
  const std::string chunk =
      R"({"id":"chatcmpl-trace.42:7-ab","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]})";
  StreamTranslator t;
  t.reset("trace.42:7-ab");
  std::string out;
  t.on_data(chunk, out);
  t.on_data("[DONE]", out);
  const auto ev = events_of(out);
  expect_grammar(ev);
  const std::string id = tool_blocks(ev).at(0).at(0);
  EXPECT_TRUE(id.starts_with("toolu_trace_42_7-ab_0-")) << id;
  EXPECT_EQ(id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"), std::string::npos)
      << id;
}

}  // namespace
}  // namespace weir::api::anthropic
