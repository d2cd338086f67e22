// OpenAI/vLLM chunks → Responses stream events, checked against the event
// grammar (response.created, response.in_progress, items added, their parts
// and deltas, .done events in order with dense output indices and
// sequence numbers, one terminal event carrying the whole response): text,
// reasoning, parallel tool calls, cached-token usage, repeated terminal
// chunks, in-stream errors, and every recording split at every byte
// through the SSE reader.
#include "api/responses/stream.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "../http/alloc_counter.hpp"
#include "http/sse.hpp"

namespace weir::api::responses {
namespace {

namespace json = boost::json;

constexpr std::string_view kEcho = R"("tools":[],"store":false)";

struct Event {
  std::string type;
  json::value data;
};

// Parses `event: T\ndata: J\n\n` blocks, checking the framing.
std::vector<Event> events_of(std::string_view s) {
  std::vector<Event> out;
  while (!s.empty()) {
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
  t.reset(kEcho, "req-1");
  std::string out;
  for (auto c : chunks) t.on_data(c, out);
  if (finish) t.finish(out);
  return out;
}

bool terminal(const std::string& type) {
  return type == "response.completed" || type == "response.incomplete" || type == "response.failed";
}

// The grammar; returns the terminal event's response. `failed`: the stream
// may end with items left open.
json::value expect_grammar(const std::vector<Event>& ev, bool failed = false) {
  EXPECT_GE(ev.size(), 3u);
  if (ev.size() < 3) return nullptr;
  EXPECT_EQ(ev[0].type, "response.created");
  EXPECT_EQ(ev[1].type, "response.in_progress");
  EXPECT_EQ(ev[0].data.at("response").at("status"), "in_progress");
  EXPECT_TRUE(ev[0].data.at("response").at("output").as_array().empty());
  for (std::size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].data.at("sequence_number"), static_cast<std::int64_t>(i)) << ev[i].type;
    EXPECT_EQ(terminal(ev[i].type), i + 1 == ev.size()) << ev[i].type;
  }
  const std::string id(ev[0].data.at("response").at("id").as_string());
  std::int64_t next = 0;
  std::int64_t open = -1;
  std::string open_id;
  std::string open_type;
  bool part_open = false;
  std::string text;
  std::vector<json::value> done_items;
  for (std::size_t i = 2; i + 1 < ev.size(); ++i) {
    const auto& e = ev[i];
    const auto& d = e.data.as_object();
    SCOPED_TRACE(e.type);
    if (e.type == "response.output_item.added") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(d.at("output_index"), next);
      open = next;
      open_id = d.at("item").at("id").as_string();
      open_type = d.at("item").at("type").as_string();
      EXPECT_EQ(d.at("item").at("status"), "in_progress");
      text.clear();
      continue;
    }
    EXPECT_EQ(d.at("output_index"), open);
    if (e.type == "response.output_item.done") {
      EXPECT_FALSE(part_open);
      EXPECT_EQ(d.at("item").at("id"), open_id.c_str());
      done_items.push_back(d.at("item"));
      open = -1;
      ++next;
      continue;
    }
    EXPECT_EQ(d.at("item_id"), open_id.c_str());
    if (e.type == "response.content_part.added") {
      EXPECT_NE(open_type, "function_call");
      EXPECT_FALSE(part_open);
      part_open = true;
      EXPECT_EQ(d.at("content_index"), 0);
    } else if (e.type == "response.content_part.done") {
      EXPECT_TRUE(part_open);
      part_open = false;
      EXPECT_EQ(d.at("part").at("text"), text.c_str());
    } else if (e.type == "response.output_text.delta" || e.type == "response.reasoning_text.delta") {
      EXPECT_TRUE(part_open);
      EXPECT_EQ(e.type == "response.output_text.delta" ? "message" : "reasoning", open_type);
      text += d.at("delta").as_string().c_str();
    } else if (e.type == "response.output_text.done" || e.type == "response.reasoning_text.done") {
      EXPECT_TRUE(part_open);
      EXPECT_EQ(d.at("text"), text.c_str());
    } else if (e.type == "response.function_call_arguments.delta") {
      EXPECT_EQ(open_type, "function_call");
      text += d.at("delta").as_string().c_str();
    } else if (e.type == "response.function_call_arguments.done") {
      EXPECT_EQ(d.at("arguments"), text.c_str());
    } else {
      ADD_FAILURE() << "unexpected event " << e.type;
    }
  }
  const auto& r = ev.back().data.at("response");
  EXPECT_EQ(r.at("id"), id.c_str());
  if (!failed) {
    EXPECT_EQ(open, -1);
    EXPECT_EQ(r.at("output").as_array(), json::array(done_items.begin(), done_items.end()));
  }
  return r;
}

constexpr std::string_view kRole =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1700000000,"model":"mock-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})";
constexpr std::string_view kTok1 =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1700000000,"model":"mock-model","choices":[{"index":0,"delta":{"content":" river"},"logprobs":null,"finish_reason":null}]})";
constexpr std::string_view kTok2 =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1700000000,"model":"mock-model","choices":[{"index":0,"delta":{"content":" stone"},"logprobs":null,"finish_reason":"length","stop_reason":null}]})";
constexpr std::string_view kUsage =
    R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1700000000,"model":"mock-model","choices":[],"usage":{"prompt_tokens":90,"total_tokens":92,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":64}}})";

const std::vector<std::string_view> kText = {kRole, kTok1, kTok2, kUsage, "[DONE]"};
const std::vector<std::string_view> kReasoningAndTools = {
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Hmm"}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":" ok"}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"content":"Sure."}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-a","type":"function","index":0,"function":{"name":"get_weather"}}]}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\": "}}]}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"type":"function","index":1,"function":{"name":"get_time","arguments":"{}"}}]}}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls","stop_reason":null}]})",
    R"({"id":"chatcmpl-t","created":3,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14,"completion_tokens_details":{"reasoning_tokens":2}}})",
    "[DONE]",
};
// A repeated finish chunk and usage chunk, then [DONE] twice.
const std::vector<std::string_view> kRepeated = {kRole, kTok1, kTok2, kTok2, kUsage, kUsage, "[DONE]", "[DONE]"};
// vLLM's in-stream error after some text.
const std::vector<std::string_view> kError = {
    kRole, kTok1, R"({"error":{"message":"engine dead","type":"InternalServerError","code":500}})", "[DONE]"};

// Mistral's API streams delta.content as a list of parts (text; magistral's thinking first): the text parts are
// the message, the thinking parts the reasoning, each as it comes; other parts skipped.
TEST(ResponsesStream, ContentPartsAreTheMessageAndTheReasoning) {
  const auto r = expect_grammar(events_of(run(
      {R"({"id":"chatcmpl-p","created":3,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
       R"({"id":"chatcmpl-p","created":3,"model":"m","choices":[{"index":0,"delta":{"content":[{"type":"thinking","thinking":[{"type":"text","text":"Let me"}]}]}}]})",
       R"({"id":"chatcmpl-p","created":3,"model":"m","choices":[{"index":0,"delta":{"content":[{"type":"thinking","thinking":" see"}]}}]})",
       R"({"id":"chatcmpl-p","created":3,"model":"m","choices":[{"index":0,"delta":{"content":[{"type":"text","text":"The answer"},{"type":"image_url"},{"type":"text","text":" is 42."}]}}]})",
       R"({"id":"chatcmpl-p","created":3,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})",
       R"({"id":"chatcmpl-p","created":3,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}})",
       "[DONE]"})));
  const auto& out = r.at("output").as_array();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].at("type"), "reasoning");
  EXPECT_EQ(out[0].at("content").at(0).at("text"), "Let me see");
  EXPECT_EQ(out[1].at("type"), "message");
  EXPECT_EQ(out[1].at("content").at(0).at("text"), "The answer is 42.");
}

TEST(ResponsesStream, TextStreamWithCachedTokensIsIncompleteAtLength) {
  const auto ev = events_of(run(kText));
  const auto r = expect_grammar(ev);
  ASSERT_EQ(ev.size(), 10u);
  EXPECT_EQ(ev[0].data.at("response"), json::parse(R"({"id":"resp_r1","object":"response","created_at":1700000000,
    "completed_at":null,"status":"in_progress","error":null,"incomplete_details":null,"model":"mock-model","output":[],"usage":null,
    "tools":[],"store":false})"));
  EXPECT_EQ(ev[2].data, json::parse(R"({"type":"response.output_item.added","sequence_number":2,"output_index":0,
    "item":{"id":"msg_r1","type":"message","role":"assistant","content":[],"status":"in_progress"}})"));
  EXPECT_EQ(ev[3].data, json::parse(R"({"type":"response.content_part.added","sequence_number":3,
    "item_id":"msg_r1","output_index":0,"content_index":0,
    "part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}})"));
  EXPECT_EQ(ev[4].data, json::parse(R"({"type":"response.output_text.delta","sequence_number":4,
    "item_id":"msg_r1","output_index":0,"content_index":0,"delta":" river","logprobs":[]})"));
  EXPECT_EQ(ev[6].data.at("text"), " river stone");
  EXPECT_EQ(ev[8].data.at("item").at("status"), "incomplete");
  EXPECT_EQ(ev.back().type, "response.incomplete");
  EXPECT_EQ(r.at("status"), "incomplete");
  EXPECT_EQ(r.at("incomplete_details"), json::parse(R"({"reason":"max_output_tokens"})"));
  EXPECT_EQ(r.at("usage"), json::parse(R"({"input_tokens":90,"input_tokens_details":{"cached_tokens":64,
    "cache_write_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":92})"));
}

TEST(ResponsesStream, ReasoningTextAndParallelToolCalls) {
  const auto ev = events_of(run(kReasoningAndTools));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.completed");
  EXPECT_EQ(r.at("status"), "completed");
  EXPECT_EQ(r.at("output"), json::parse(R"([
    {"id":"rs_t","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"Hmm ok"}],"status":"completed"},
    {"id":"msg_t","type":"message","role":"assistant","content":[{"type":"output_text","text":"Sure.","annotations":[],
      "logprobs":[]}],"status":"completed"},
    {"id":"fc_t_0","type":"function_call","call_id":"chatcmpl-tool-a","name":"get_weather","arguments":"{\"q\": \"Paris\"}",
      "status":"completed"},
    {"id":"fc_t_1","type":"function_call","call_id":"call_t_1","name":"get_time","arguments":"{}","status":"completed"}])"));
  EXPECT_EQ(r.at("usage").at("output_tokens_details").at("reasoning_tokens"), 2);
  // Reasoning never leaks into the message text.
  for (const auto& e : ev) {
    if (e.type == "response.output_text.delta") {
      EXPECT_EQ(e.data.at("delta"), "Sure.");
    }
  }
  bool args_done = false;
  for (const auto& e : ev) {
    if (e.type == "response.function_call_arguments.done" && e.data.at("output_index") == 2) {
      EXPECT_EQ(e.data.at("name"), "get_weather");
      args_done = true;
    }
  }
  EXPECT_TRUE(args_done);
}

TEST(ResponsesStream, ParallelToolCallsWithoutIndexAreToldApartByTheirIds) {
  // Some OpenAI-compatible servers give no `index`: a new id starts the next call, an entry without one
  // continues the open call.
  const auto ev = events_of(run({
      R"({"id":"chatcmpl-n","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]}}]})",
      R"({"id":"chatcmpl-n","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"{\"city\": \"Paris\"}"}}]}}]})",
      R"({"id":"chatcmpl-n","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\""}}]}}]})",
      R"({"id":"chatcmpl-n","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_b","function":{"arguments":": \"CET\"}"}}]}}]})",
      R"({"id":"chatcmpl-n","created":3,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(r.at("output"), json::parse(R"([
    {"id":"fc_n_0","type":"function_call","call_id":"call_a","name":"get_weather","arguments":"{\"city\": \"Paris\"}",
      "status":"completed"},
    {"id":"fc_n_1","type":"function_call","call_id":"call_b","name":"get_time","arguments":"{\"tz\": \"CET\"}",
      "status":"completed"}])"));
}

TEST(ResponsesStream, EveryOutputItemHasItsOwnId) {
  // Reasoning, text, reasoning, text, a tool call, text: two of each kind (ids were rs_a, msg_a, rs_a, msg_a,
  // fc_a_0, msg_a: clients that key items by item_id merged them).
  const std::vector<std::string_view> alternating = {
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"r1"}}]})",
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"content":"t1"}}]})",
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"r2"}}]})",
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"content":"t2"}}]})",
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"type":"function","function":{"name":"f","arguments":"{}"}}]}}]})",
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"content":"t3"}}]})",
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})",
      "[DONE]"};
  const auto ev = events_of(run(alternating));
  const auto r = expect_grammar(ev);
  std::vector<std::string> ids;
  for (const auto& item : r.at("output").as_array()) ids.emplace_back(item.at("id").as_string());
  EXPECT_EQ(ids, (std::vector<std::string>{"rs_a", "msg_a", "rs_a_1", "msg_a_1", "fc_a_0", "msg_a_2"}));
  // Each delta names its own item.
  std::vector<std::string> delta_items;
  for (const auto& e : ev)
    if (e.type == "response.output_text.delta") delta_items.emplace_back(e.data.at("item_id").as_string());
  EXPECT_EQ(delta_items, (std::vector<std::string>{"msg_a", "msg_a_1", "msg_a_2"}));
}

TEST(ResponsesStream, TwentyThousandAlternatingItemsHaveUniqueIdsByCount) {
  // Reasoning and text alternating 10,000 times each: every switch opens an item. An item's id suffix is its
  // count among its stem's items (a search of the earlier items for a free _n was O(n^3) per stream: minutes
  // of one worker's CPU at this size).
  constexpr int kItems = 20000;
  std::vector<std::string> chunks;
  chunks.reserve(kItems + 2);
  for (int i = 0; i < kItems; ++i)
    chunks.push_back(
        fmt::format(R"({{"id":"chatcmpl-a","created":3,"model":"m","choices":[{{"index":0,"delta":{{"{}":"x"}}}}]}})",
                    i % 2 ? "content" : "reasoning_content"));
  chunks.emplace_back(
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})");
  chunks.emplace_back("[DONE]");
  const auto ev = events_of(run(std::vector<std::string_view>(chunks.begin(), chunks.end())));
  const auto r = expect_grammar(ev);
  const auto& output = r.at("output").as_array();
  ASSERT_EQ(output.size(), static_cast<std::size_t>(kItems));
  std::set<std::string> ids;
  for (std::size_t i = 0; i < output.size(); ++i) {
    const std::string id(output[i].at("id").as_string());
    const std::string stem = i % 2 ? "msg_a" : "rs_a";
    EXPECT_EQ(id, i < 2 ? stem : fmt::format("{}_{}", stem, i / 2));
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), output.size());
}

TEST(ResponsesStream, RepeatedFinishAndUsageGiveOneTerminal) {
  const std::string out = run(kRepeated);
  const auto ev = events_of(out);
  expect_grammar(ev);
  EXPECT_EQ(out.find("[DONE]"), std::string::npos);
  int terminals = 0;
  for (const auto& e : ev) terminals += terminal(e.type);
  EXPECT_EQ(terminals, 1);
  EXPECT_EQ(ev.back().data.at("response").at("output").at(0).at("content").at(0).at("text"), " river stone");
}

TEST(ResponsesStream, NoUsageChunkEndsAtDoneOrBodyEnd) {
  auto ev = events_of(run({kRole, kTok1, kTok2, "[DONE]"}, false));
  auto r = expect_grammar(ev);
  EXPECT_TRUE(r.at("usage").is_null());
  ev = events_of(run({kRole, kTok1, kTok2}));
  r = expect_grammar(ev);
  EXPECT_EQ(r.at("status"), "incomplete");
}

TEST(ResponsesStream, UpstreamErrorsAndEarlyEndsFail) {
  // vLLM's in-stream error: response.failed with its message, the open item left as is.
  auto ev = events_of(run(kError));
  auto r = expect_grammar(ev, true);
  EXPECT_EQ(ev.back().type, "response.failed");
  EXPECT_EQ(r.at("status"), "failed");
  EXPECT_EQ(r.at("error"), json::parse(R"({"code":"server_error","message":"engine dead"})"));
  EXPECT_EQ(r.at("output").at(0).at("status"), "incomplete");
  // The body ended (or [DONE] came) without a finish_reason.
  ev = events_of(run({kRole, kTok1}));
  EXPECT_EQ(ev.back().type, "response.failed");
  ev = events_of(run({kRole, kTok1, "[DONE]"}, false));
  EXPECT_EQ(ev.back().type, "response.failed");
  // A failure reported by the gateway after the head went out: one terminal, then nothing.
  StreamTranslator t;
  t.reset(kEcho, "req-1");
  std::string out;
  t.on_data(kRole, out);
  t.fail(504, "timed out", out);
  t.fail(504, "timed out", out);
  t.on_data(kTok1, out);
  t.finish(out);
  ev = events_of(out);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[2].data.at("response").at("error").at("message"), "timed out");
  EXPECT_TRUE(t.ended());
  // Nothing at all from the upstream: created and in_progress, named by the request id, then failed.
  ev = events_of(run({"[DONE]"}));
  ASSERT_EQ(ev.size(), 3u);
  expect_grammar(ev, true);
  EXPECT_EQ(ev[0].data.at("response").at("id"), "resp_req-1");
  // A chunk that is not JSON.
  ev = events_of(run({kRole, "{nope"}));
  EXPECT_EQ(ev.back().type, "response.failed");
}

TEST(ResponsesStream, InterleavedToolDeltasCutShortFail) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]})",
  }));
  expect_grammar(ev, true);
  EXPECT_EQ(ev.back().type, "response.failed");
  // No call was done: a client never saw one complete before it was.
  for (const auto& e : ev) EXPECT_NE(e.type, "response.output_item.done");
}

// The function_call items of the terminal response: [call_id, name, arguments] each.
std::vector<std::vector<std::string>> calls_of(const json::value& r) {
  std::vector<std::vector<std::string>> out;
  for (const auto& o : r.at("output").as_array())
    if (o.at("type") == "function_call")
      out.push_back({std::string(o.at("call_id").as_string()), std::string(o.at("name").as_string()),
                     std::string(o.at("arguments").as_string())});
  return out;
}

TEST(ResponsesStream, TwentyThousandToolCallsInterleavedAreGivenWholeInOrder) {
  // 20,000 calls begun one after another (all but the first held), then each one's arguments in reverse
  // order: each entry is routed by a map, held calls are released by a cursor (linear scans per entry were
  // quadratic: 22 s per stream at 64,000 calls).
  constexpr int kCalls = 20000;
  std::vector<std::string> chunks;
  constexpr std::string_view kHead =
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[)";
  constexpr std::string_view kTail = "]}}]}";
  for (int i = 0; i < kCalls; ++i)
    chunks.push_back(
        fmt::format(R"({}{{"index":{},"id":"call{}","type":"function","function":{{"name":"f{}","arguments":""}}}}{})",
                    kHead, i, i, i, kTail));
  for (int i = kCalls; i-- > 0;)
    chunks.push_back(
        fmt::format(R"({}{{"index":{},"function":{{"arguments":"{{\"n\":{}}}"}}}}{})", kHead, i, i, kTail));
  chunks.emplace_back(
      R"({"id":"chatcmpl-a","created":3,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})");
  chunks.emplace_back("[DONE]");
  const auto ev = events_of(run(std::vector<std::string_view>(chunks.begin(), chunks.end())));
  const auto r = expect_grammar(ev);
  const auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), static_cast<std::size_t>(kCalls));
  std::set<std::string> ids;
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(calls[i], (std::vector<std::string>{fmt::format("call{}", i), fmt::format("f{}", i),
                                                  fmt::format(R"({{"n":{}}})", i)}));
    ids.insert(std::string(r.at("output").at(i).at("id").as_string()));
  }
  EXPECT_EQ(ids.size(), static_cast<std::size_t>(kCalls));
}

TEST(ResponsesStream, AToolNameIsWholeInEveryEventWhateverItsPieces) {
  // As for Anthropic: "get_" + "weather" with the arguments, "f" repeated, and arguments that say none
  // ("null", whitespace) give "{}".
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"get_","arguments":"{\"a\":"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"weather","arguments":"1}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"b","function":{"name":"f","arguments":"{"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"n","function":{"name":"g","arguments":"null"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"w","function":{"name":"h","arguments":" "}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.completed");
  EXPECT_EQ(calls_of(r),
            (std::vector<std::vector<std::string>>{
                {"a", "get_weather", R"({"a":1})"}, {"b", "f", "{}"}, {"n", "g", "{}"}, {"w", "h", "{}"}}));
  std::vector<std::string> added;
  for (const auto& e : ev)
    if (e.type == "response.output_item.added") added.emplace_back(e.data.at("item").at("name").as_string());
  EXPECT_EQ(added, (std::vector<std::string>{"get_weather", "f", "g", "h"}));
}

TEST(ResponsesStream, UnencodedArgumentsAreTheirJsonText) {
  // Arguments sent as a JSON value, not a string (they were "{}"): its JSON text, an object streamed, a
  // number given at the item's end as the string "5" is.
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":{"city":"Paris"}}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":5}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.completed");
  EXPECT_EQ(calls_of(r), (std::vector<std::vector<std::string>>{{"a", "f", R"({"city":"Paris"})"}, {"b", "g", "5"}}));
}

TEST(ResponsesStream, InterleavedToolDeltasAreHeldAndGivenInOrder) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"get_weather","arguments":""}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"get_time","arguments":""}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"tz\":\"UTC\"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.completed");
  EXPECT_EQ(calls_of(r), (std::vector<std::vector<std::string>>{{"a", "get_weather", R"({"city":"Paris"})"},
                                                                {"b", "get_time", R"({"tz":"UTC"})"}}));
}

TEST(ResponsesStream, HeldToolCallsCutByLengthLeaveOnlyTheLastIncomplete) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{\"x\":"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]})",
      "[DONE]",
  }));
  // (expect_grammar checks that the final output repeats the output_item.done items.)
  const auto r = expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.incomplete");
  EXPECT_EQ(r.at("output").at(0).at("status"), "completed");
  EXPECT_EQ(r.at("output").at(1).at("status"), "incomplete");
}

TEST(ResponsesStream, ANewIdOnTheOpenIndexStartsANewCall) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_2","function":{"name":"get_time","arguments":"{}"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(calls_of(r), (std::vector<std::vector<std::string>>{{"call_1", "get_weather", R"({"city":"Paris"})"},
                                                                {"call_2", "get_time", "{}"}}));
}

TEST(ResponsesStream, ToolArgumentsThatAreNoJsonFailUnlessCutByLength) {
  const std::string_view a =
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"a\": "}}]}}]})";
  const std::string_view b =
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"tru"}}]}}]})";
  auto ev = events_of(run(
      {a, b, R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})", "[DONE]"}));
  expect_grammar(ev, true);
  EXPECT_EQ(ev.back().type, "response.failed");
  EXPECT_EQ(ev.back().data.at("response").at("error").at("code"), "server_error");
  ev = events_of(
      run({a, b, R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]})", "[DONE]"}));
  expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.incomplete");
}

// Only the call the limit cut (the last item) is exempt under "length": an earlier call's garbled arguments
// were whole when the model went on, so the response fails as it would without the limit (streamed, held).
TEST(ResponsesStream, AnEarlierCallWithGarbledArgumentsFailsUnderLengthToo) {
  const std::vector<std::string_view> calls = {
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"r\": tru"}}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"g","arguments":"{\"tz\": \"U"}}]}}]})",
  };
  for (const std::string_view finish : {"length", "tool_calls"}) {
    auto c = calls;
    const std::string f =
        R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":")" + std::string(finish) + "\"}]}";
    c.push_back(f);
    c.push_back("[DONE]");
    const auto ev = events_of(run(c));
    expect_grammar(ev, true);
    EXPECT_EQ(ev.back().type, "response.failed") << finish;
    for (const auto& e : ev) {
      if (e.type == "response.output_item.done") {
        EXPECT_NE(e.data.at("item").at("call_id"), "a") << finish;
      }
    }
  }
  // The earlier call whole, the last one cut: incomplete, the cut call's item too.
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{\"r\": true}"}}]}}]})",
      calls[1],
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.incomplete");
  EXPECT_EQ(r.at("output").at(0).at("status"), "completed");
  EXPECT_EQ(r.at("output").at(1).at("status"), "incomplete");
  EXPECT_EQ(r.at("output").at(1).at("arguments"), R"({"tz": "U)");
}

// A chunk's logprobs are its output_text.delta's; the .done events and the final item have them all.
TEST(ResponsesStream, LogprobsAreTheOutputTexts) {
  const auto ev = events_of(run({
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"o"},"logprobs":{"content":[{"token":"o","logprob":-0.5,"bytes":[111],"top_logprobs":[]}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"k"},"logprobs":{"content":[{"token":"k","logprob":-0.25,"bytes":[107],"top_logprobs":[]}]}}]})",
      R"({"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  const auto o = json::parse(R"({"token":"o","logprob":-0.5,"bytes":[111],"top_logprobs":[]})");
  const auto k = json::parse(R"({"token":"k","logprob":-0.25,"bytes":[107],"top_logprobs":[]})");
  std::vector<json::value> deltas;
  for (const auto& e : ev) {
    if (e.type == "response.output_text.delta") deltas.push_back(e.data.at("logprobs"));
    if (e.type == "response.output_text.done") {
      EXPECT_EQ(e.data.at("logprobs"), json::array({o, k}));
    }
    if (e.type == "response.content_part.done") {
      EXPECT_EQ(e.data.at("part").at("logprobs"), json::array({o, k}));
    }
  }
  EXPECT_EQ(deltas, (std::vector<json::value>{json::array({o}), json::array({k})}));
  EXPECT_EQ(r.at("output").at(0).at("content").at(0).at("logprobs"), json::array({o, k}));
}

TEST(ResponsesStream, EmptyDataEventsAreSkipped) {
  const auto ev = events_of(run({kRole, "", " ", kTok1, "", kTok2, kUsage, "[DONE]"}));
  expect_grammar(ev);
  EXPECT_EQ(ev.back().type, "response.incomplete");
}

TEST(ResponsesStream, AnIdOfJustChatcmplTakesTheRequestId) {
  const auto ev = events_of(run({
      R"({"id":"chatcmpl-","model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]})",
      "[DONE]",
  }));
  const auto r = expect_grammar(ev);
  EXPECT_EQ(r.at("id"), "resp_req-1");
}

// `s` with every "completed_at":<seconds> written as "completed_at":T: the
// time a response completes is the wall clock's, which may tick between two
// runs of the same recording (a slow sanitizer build crossed a second).
std::string without_completion_time(std::string s) {
  static constexpr std::string_view kKey = R"("completed_at":)";
  for (std::size_t at = s.find(kKey); at != std::string::npos; at = s.find(kKey, at + kKey.size())) {
    std::size_t end = at + kKey.size();
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    if (end > at + kKey.size()) s.replace(at + kKey.size(), end - at - kKey.size(), "T");
  }
  return s;
}

TEST(ResponsesStream, EveryRecordingSplitAnywhereGivesTheSameEvents) {
  for (const auto* rec : {&kText, &kReasoningAndTools, &kRepeated, &kError}) {
    std::string wire;
    for (auto c : *rec) http::append_sse_data(wire, c);
    const std::string want = run(*rec);
    const std::string want_timeless = without_completion_time(want);
    for (std::size_t cut = 1; cut < wire.size(); ++cut) {
      http::SseReader reader;
      StreamTranslator t;
      t.reset(kEcho, "req-1");
      std::string out;
      for (std::string_view part : {std::string_view(wire).substr(0, cut), std::string_view(wire).substr(cut)}) {
        reader.push(part);
        while (auto ev = reader.next())
          if (ev->has_data) t.on_data(ev->data, out);
      }
      t.finish(out);
      ASSERT_EQ(without_completion_time(out), want_timeless) << "cut at " << cut;
    }
    expect_grammar(events_of(want), rec == &kError);
  }
}

// Steady state: a text delta costs no allocation of its own; the item's
// text grows geometrically (DESIGN.md, Memory). The Anthropic translator
// keeps no text, so this is the one cost the Responses grammar adds.
TEST(ResponsesStream, TextDeltasAllocateOnlyForTheGrowingText) {
  if (!test::AllocationScope::available()) GTEST_SKIP() << "allocation counting is off in this build";
  StreamTranslator t;
  t.reset(kEcho, "req-1");
  std::string out;
  out.reserve(64 * 1024);
  t.on_data(kRole, out);
  t.on_data(kTok1, out);  // the message item is open
  constexpr int kEvents = 4000;
  std::size_t allocations = 0;
  {
    test::AllocationScope scope;
    for (int i = 0; i < kEvents; ++i) {
      out.clear();
      t.on_data(kTok1, out);
    }
    allocations = scope.count();
  }
  // " river" × 4000 = 24 KB of text: about log2(24K / 15) ≈ 11 doublings.
  EXPECT_LE(allocations, 16u) << allocations << " allocations over " << kEvents << " events";
}

TEST(ResponsesStream, CallIdsWeirMakesAreIdsEveryApiTakes) {
  const auto ev = events_of(run(
      {R"({"id":"chatcmpl-trace.42:7-ab","created":3,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"type":"function","function":{"name":"f","arguments":"{}"}}]}}]})",
       R"({"id":"chatcmpl-trace.42:7-ab","created":3,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})",
       "[DONE]"}));
  const auto r = expect_grammar(ev);
  const std::string call_id(r.at("output").at(0).at("call_id").as_string());
  EXPECT_TRUE(call_id.starts_with("call_trace_42_7-ab_0-")) << call_id;
  EXPECT_EQ(call_id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"),
            std::string::npos)
      << call_id;
}

}  // namespace
}  // namespace weir::api::responses
