// The per-event stream hooks (gateway::StreamHooks over
// api::openai::UsageHook) on real SSE events, and ask_for_usage's edit of
// the request body: only the usage chunk Weir asked for is dropped, usage
// is read either way, [DONE] ends the stream for the client, comments pass;
// the body edit changes stream_options and nothing else; nothing after
// [DONE] reaches the client; the usage chunk is known by its shape, also
// when its counts are invalid.
#include "gateway/stream_hooks.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../http/alloc_counter.hpp"
#include "api/openai/stream.hpp"
#include "http/sse.hpp"

namespace weir::gateway {
namespace {

using api::openai::ask_for_usage;
using api::openai::is_usage_only_chunk;

constexpr std::string_view kContent =
    R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]})";
// vLLM's content chunk when include_usage is on: usage null.
constexpr std::string_view kContentUsageNull =
    R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"!"}}],"usage":null})";
// vLLM's final usage chunk.
constexpr std::string_view kUsageOnly =
    R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7}})";
// continuous_usage_stats: usage on a chunk that has choices.
constexpr std::string_view kContentWithUsage =
    R"({"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}})";

std::string event(std::string_view data) { return "data: " + std::string(data) + "\n\n"; }

// What the client gets from `stream` through `hooks`: the raw bytes of the
// events on_event lets through, in order.
std::string relay(StreamHooks& hooks, std::string_view stream) {
  http::SseReader reader;
  reader.push(stream);
  std::string out;
  while (auto ev = reader.next())
    if (hooks.on_event(*ev)) out += ev->raw;
  EXPECT_EQ(reader.pending_bytes(), 0u) << "the test stream should be whole events";
  return out;
}

TEST(GatewayStreamHooks, UsageChunkIsDroppedWhenWeirAskedForIt) {
  StreamHooks hooks;
  hooks.reset(/*strip_usage=*/true);
  const std::string stream = event(kContent) + event(kContentUsageNull) + event(kUsageOnly) + event("[DONE]");
  EXPECT_EQ(relay(hooks, stream), event(kContent) + event(kContentUsageNull) + event("[DONE]"));
  ASSERT_TRUE(hooks.usage().has_usage());
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 12u);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 7u);
  EXPECT_EQ(hooks.usage().usage().total_tokens, 19u);
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_EQ(hooks.data_events(), 3u);  // the dropped chunk is not the client's
}

TEST(GatewayStreamHooks, UsageChunkPassesWhenTheClientAskedForIt) {
  StreamHooks hooks;
  hooks.reset(/*strip_usage=*/false);
  const std::string stream = event(kContent) + event(kUsageOnly) + event("[DONE]");
  EXPECT_EQ(relay(hooks, stream), stream);
  ASSERT_TRUE(hooks.usage().has_usage());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 7u);
  EXPECT_EQ(hooks.data_events(), 3u);
}

TEST(GatewayStreamHooks, UsageOnAChunkWithChoicesIsReadAndOnlyItsUsageDropped) {
  // The chunk's content is the client's; the usage member Weir asked for is not (strip), or is (asked).
  StreamHooks hooks;
  hooks.reset(true);
  const std::string stream = event(kContentWithUsage) + event("[DONE]");
  const std::string got = relay(hooks, stream);
  EXPECT_EQ(got.find("\"usage\""), std::string::npos) << got;
  EXPECT_NE(got.find("\"choices\""), std::string::npos) << got;
  ASSERT_TRUE(hooks.usage().has_usage());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 1u);
  StreamHooks asked;
  asked.reset(false);
  EXPECT_EQ(relay(asked, stream), stream);
}

TEST(GatewayStreamHooks, LastUsageWins) {
  StreamHooks hooks;
  hooks.reset(true);
  relay(hooks, event(kContentWithUsage) + event(kUsageOnly));
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 7u);
}

TEST(GatewayStreamHooks, NoUsageWithoutAUsageObject) {
  StreamHooks hooks;
  hooks.reset(true);
  relay(hooks, event(kContent) + event(kContentUsageNull) + event(R"({"choices":[],"usage":"n/a"})"));
  EXPECT_FALSE(hooks.usage().has_usage());
}

TEST(GatewayStreamHooks, DoneSetsDoneRelayedAndCounts) {
  StreamHooks hooks;
  hooks.reset(false);
  EXPECT_FALSE(hooks.done_relayed());
  EXPECT_EQ(relay(hooks, event(kContent)), event(kContent));
  EXPECT_FALSE(hooks.done_relayed());
  EXPECT_EQ(hooks.data_events(), 1u);
  EXPECT_EQ(relay(hooks, "data: [DONE]\r\n\r\n"), "data: [DONE]\r\n\r\n");
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_EQ(hooks.data_events(), 2u);
  // "[DONE]" passes even with strip on and is never taken for usage.
  hooks.reset(true);
  EXPECT_EQ(relay(hooks, event("[DONE]")), event("[DONE]"));
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_FALSE(hooks.usage().has_usage());
}

TEST(GatewayStreamHooks, CommentsAndBlankBlocksPassThroughUncounted) {
  StreamHooks hooks;
  hooks.reset(true);
  const std::string stream = ": keep-alive\n\n" + event(kContent) + "\n" + ": ping\r\n\r\n" + "event: x\nid: 3\n\n";
  EXPECT_EQ(relay(hooks, stream), stream);
  EXPECT_EQ(hooks.data_events(), 1u);
  EXPECT_FALSE(hooks.done_relayed());
}

TEST(GatewayStreamHooks, ResetForgetsTheLastStream) {
  StreamHooks hooks;
  hooks.reset(true);
  relay(hooks, event(kUsageOnly) + event("[DONE]"));
  ASSERT_TRUE(hooks.done_relayed());
  ASSERT_TRUE(hooks.usage().has_usage());
  hooks.reset(false);
  EXPECT_FALSE(hooks.done_relayed());
  EXPECT_EQ(hooks.data_events(), 0u);
  EXPECT_FALSE(hooks.usage().has_usage());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 0u);
  EXPECT_EQ(relay(hooks, event(kUsageOnly)), event(kUsageOnly));  // strip is off now
}

TEST(GatewayStreamHooks, UsageChunkSplitAcrossPushesIsStillDropped) {
  StreamHooks hooks;
  hooks.reset(true);
  const std::string stream = event(kContent) + event(kUsageOnly) + event("[DONE]");
  for (std::size_t k = 1; k < stream.size(); ++k) {
    hooks.reset(true);
    http::SseReader reader;
    std::string out;
    const std::string a = stream.substr(0, k), b = stream.substr(k);
    for (const std::string* piece : {&a, &b}) {
      reader.push(*piece);
      while (auto ev = reader.next())
        if (hooks.on_event(*ev)) out += ev->raw;
    }
    ASSERT_EQ(out, event(kContent) + event("[DONE]")) << "split at " << k;
    ASSERT_TRUE(hooks.usage().has_usage());
  }
}

TEST(GatewayStreamHooks, NothingAfterDoneReachesTheClient) {
  // vLLM ends with one [DONE]; a second one, late chunks and comments after it are not the client's.
  StreamHooks hooks;
  hooks.reset(true);
  const std::string stream =
      event(kContent) + event("[DONE]") + event(kContentWithUsage) + ": late\n\n" + event(kUsageOnly) + event("[DONE]");
  EXPECT_EQ(relay(hooks, stream), event(kContent) + event("[DONE]"));
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_EQ(hooks.data_events(), 2u);
  EXPECT_FALSE(hooks.usage().has_usage()) << "usage after [DONE] is not read";
}

TEST(GatewayStreamHooks, TheUsageChunkWeirAskedForIsDroppedWhateverItsCounts) {
  // Known by its shape (choices [] and a usage member), not by whether its numbers read.
  for (std::string_view bad : {
           R"({"id":"c1","choices":[],"usage":{"prompt_tokens":-1000,"completion_tokens":-5000,"total_tokens":-6000}})",
           R"({"id":"c1","choices":[],"usage":{"prompt_tokens":1.5,"completion_tokens":2,"total_tokens":3}})",
           R"({"id":"c1","choices":[],"usage":{"prompt_tokens":"12","completion_tokens":2,"total_tokens":14}})",
           R"({"id":"c1","choices":[],"usage":{"prompt_tokens":99999999999999999999999,"completion_tokens":1}})",
           R"({"id":"c1","choices":[],"usage":null})",
           R"({"id":"c1","choices":[],"usage":"n/a"})",
       }) {
    SCOPED_TRACE(bad);
    StreamHooks hooks;
    hooks.reset(/*strip_usage=*/true);
    EXPECT_EQ(relay(hooks, event(kContent) + event(bad) + event("[DONE]")), event(kContent) + event("[DONE]"));
    EXPECT_FALSE(hooks.usage().has_usage()) << "invalid counts are no usage";
    EXPECT_EQ(hooks.data_events(), 2u);
    // A client that asked for usage gets the chunk as the upstream sent it (still no usage for metering).
    hooks.reset(/*strip_usage=*/false);
    EXPECT_EQ(relay(hooks, event(bad)), event(bad));
    EXPECT_FALSE(hooks.usage().has_usage());
  }
}

TEST(GatewayStreamHooks, AnInvalidUsageLeavesAnEarlierValidOne) {
  StreamHooks hooks;
  hooks.reset(true);
  relay(hooks, event(kContentWithUsage) + event(R"({"choices":[],"usage":{"prompt_tokens":-1}})"));
  ASSERT_TRUE(hooks.usage().has_usage());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 1u);
}

TEST(GatewayStreamHooks, NoAllocationPerEvent) {
  // The relay's hot path (DESIGN.md, Memory): content chunks, Weir's usage chunk (valid or not), [DONE]
  // and what follows it go through on_event without touching the heap.
  if (!test::AllocationScope::available()) GTEST_SKIP() << "operator new is not the counting one here";
  std::string stream;
  for (int i = 0; i < 64; ++i) stream += event(kContent) + event(kContentUsageNull);
  stream += event(R"({"id":"c1","choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":2}})") +
            event(kUsageOnly) + event("[DONE]") + event(kContent) + event("[DONE]");
  StreamHooks hooks;
  http::SseReader reader;
  std::size_t passed = 0;
  std::size_t allocations = 0;
  {
    test::AllocationScope scope;
    hooks.reset(true);
    reader.push(stream);
    while (auto ev = reader.next()) passed += hooks.on_event(*ev) ? 1 : 0;
    allocations = scope.count();
  }
  EXPECT_EQ(allocations, 0u);
  EXPECT_EQ(passed, 129u);  // the content chunks and one [DONE]
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 7u);
}

// A continuous_usage_stats chunk as vLLM writes it: one choice, its prompt's tokens and its own so far.
std::string choice_chunk(int index, int prompt, int done, bool completions = false) {
  const std::string choice = completions
                                 ? R"({"index":)" + std::to_string(index) + R"(,"text":" t","finish_reason":null})"
                                 : R"({"index":)" + std::to_string(index) + R"(,"delta":{"content":" t"}})";
  return R"({"id":"c1","object":"x","created":1,"model":"m","choices":[)" + choice + R"(],"usage":{"prompt_tokens":)" +
         std::to_string(prompt) + R"(,"total_tokens":)" + std::to_string(prompt + done) + R"(,"completion_tokens":)" +
         std::to_string(done) + "}}";
}

// DEFECT: with continuous_usage_stats every chunk's usage counts only its own choice and prompt, yet the last
// one read was taken for the request's: a stream cut before its usage-only chunk (the client left, the
// upstream reset) was charged one choice of one prompt (1/(n × prompts) of it). Per-choice counts are
// summed (the last of each choice; the prompt once per prompt) and said not to be the whole (whole()).
TEST(GatewayStreamHooks, PerChoiceUsageIsSummedAndNotTheWhole) {
  StreamHooks hooks;
  // Chat, n = 4: one prompt of 9 tokens, each choice 3 tokens in (role chunks first: 0 each).
  hooks.reset(StreamHooks::Setup{.choices_per_prompt = 4});
  std::string stream;
  for (int i = 0; i < 4; ++i) stream += event(choice_chunk(i, 9, 0));
  for (int step = 1; step <= 3; ++step)
    for (int i = 0; i < 4; ++i) stream += event(choice_chunk(i, 9, step));
  EXPECT_EQ(relay(hooks, stream), stream);
  ASSERT_TRUE(hooks.usage().has_usage());
  EXPECT_FALSE(hooks.usage().whole());
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 9u);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 12u);
  EXPECT_EQ(hooks.usage().usage().total_tokens, 21u);
  // Its usage-only chunk then: the request's total, whatever the choices said.
  relay(hooks, event(kUsageOnly));
  EXPECT_TRUE(hooks.usage().whole());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 7u);

  // Completions, 3 prompts (5, 6, 7 tokens) × n = 2, index = prompt × 2 + choice; the last prompt's second
  // choice said nothing yet.
  hooks.reset(StreamHooks::Setup{.choices_per_prompt = 2});
  stream.clear();
  for (int step = 1; step <= 2; ++step)
    for (int i = 0; i < 6; ++i)
      if (i != 5) stream += event(choice_chunk(i, 5 + i / 2, step, true));
  relay(hooks, stream);
  EXPECT_FALSE(hooks.usage().whole());
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 5u + 6u + 7u);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 5u * 2u);

  // A chunk whose choice has no readable index counts as choice 0; one past kMaxChoices is not counted.
  hooks.reset(StreamHooks::Setup{});
  relay(hooks,
        event(R"({"choices":[{"delta":{}}],"usage":{"prompt_tokens":2,"completion_tokens":1}})") +
            event(R"({"choices":[{"index":99999999,"delta":{}}],"usage":{"prompt_tokens":2,"completion_tokens":50}})"));
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 1u);
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 2u);
  // A usage chunk without any "choices" is a total, as the usage-only chunk is.
  hooks.reset(StreamHooks::Setup{});
  relay(hooks, event(R"({"id":"x","usage":{"prompt_tokens":3,"completion_tokens":4}})"));
  EXPECT_TRUE(hooks.usage().whole());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 4u);
}

// DEFECT: a stream cut short was charged the larger of Weir's prompt estimate and its choices' prompt count,
// although the count was the upstream's whole count of the prompt. every_prompt() says when the choices said
// every prompt's count (settle() then charges exactly that), and when a prompt list's are not all in yet.
TEST(GatewayStreamHooks, PerChoiceUsageSaysWhenEveryPromptSaidItsCount) {
  StreamHooks hooks;
  // Chat (one prompt): its role chunk says the prompt's count.
  hooks.reset(StreamHooks::Setup{});
  EXPECT_FALSE(hooks.usage().every_prompt());
  relay(hooks, event(choice_chunk(0, 155, 0)));
  EXPECT_TRUE(hooks.usage().every_prompt());
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 155u);
  // n = 3: any one of the prompt's choices says it.
  hooks.reset(StreamHooks::Setup{.choices_per_prompt = 3});
  relay(hooks, event(choice_chunk(2, 9, 1)));
  EXPECT_TRUE(hooks.usage().every_prompt());

  // Completions, 3 prompts × n = 2 (index = prompt × 2 + choice): not until a choice of each prompt spoke.
  hooks.reset(StreamHooks::Setup{.choices_per_prompt = 2, .prompts = 3});
  relay(hooks,
        event(choice_chunk(0, 5, 1, true)) + event(choice_chunk(1, 5, 1, true)) + event(choice_chunk(3, 6, 1, true)));
  EXPECT_FALSE(hooks.usage().every_prompt());  // the third prompt (indexes 4 and 5) said nothing
  relay(hooks, event(choice_chunk(5, 7, 1, true)));
  EXPECT_TRUE(hooks.usage().every_prompt());
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 5u + 6u + 7u);
  // A prompt past kMaxChoices is never said: the list keeps its floor.
  hooks.reset(StreamHooks::Setup{.prompts = 5000});
  std::string stream;
  for (int i = 0; i < 4096; ++i) stream += event(choice_chunk(i, 2, 1, true));
  relay(hooks, stream);
  EXPECT_FALSE(hooks.usage().every_prompt());
  // A total (the usage-only chunk) is every prompt's.
  hooks.reset(StreamHooks::Setup{.prompts = 2});
  relay(hooks, event(kUsageOnly));
  EXPECT_TRUE(hooks.usage().every_prompt());
}

// A choice's counts only grow (vLLM's are that choice's so far, its prompt's the same on every chunk): a later
// chunk that says less (a broken or hostile upstream, then cut) lowers nothing already reported.
TEST(GatewayStreamHooks, PerChoiceUsageKeepsTheLargestCountOfEachChoice) {
  StreamHooks hooks;
  hooks.reset(StreamHooks::Setup{});
  relay(hooks, event(choice_chunk(0, 155, 4)) + event(choice_chunk(0, 0, 1)));
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 155u);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 4u);
  relay(hooks, event(choice_chunk(0, 155, 6)));
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 6u);
}

TEST(GatewayStreamHooks, PerChoiceUsageAllocatesOnlyForNewChoices) {
  if (!test::AllocationScope::available()) GTEST_SKIP() << "operator new is not the counting one here";
  StreamHooks hooks;
  hooks.reset(StreamHooks::Setup{.choices_per_prompt = 4});
  std::string stream;
  for (int i = 0; i < 4; ++i) stream += event(choice_chunk(i, 9, 1));
  relay(hooks, stream);  // (the first stream sizes the per-choice state)
  for (int step = 2; step < 40; ++step)
    for (int i = 0; i < 4; ++i) stream += event(choice_chunk(i, 9, step));
  http::SseReader reader;
  std::size_t allocations = 0;
  {
    hooks.reset(StreamHooks::Setup{.choices_per_prompt = 4});
    reader.push(stream);
    test::AllocationScope scope;
    while (auto ev = reader.next()) (void)hooks.on_event(*ev);
    allocations = scope.count();
  }
  EXPECT_EQ(allocations, 0u);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 4u * 39u);
}

TEST(ApiOpenAiStream, IsUsageOnlyChunk) {
  EXPECT_TRUE(is_usage_only_chunk(kUsageOnly));
  EXPECT_TRUE(is_usage_only_chunk(R"({"choices":[ ],"usage":{}})"));
  EXPECT_TRUE(is_usage_only_chunk("{\"choices\":[\n\t],\"usage\":{}}"));
  EXPECT_FALSE(is_usage_only_chunk(kContentWithUsage));
  EXPECT_FALSE(is_usage_only_chunk(R"({"usage":{"prompt_tokens":1}})"));               // no choices member
  EXPECT_FALSE(is_usage_only_chunk(R"({"choices":[]})"));                              // no usage member
  EXPECT_FALSE(is_usage_only_chunk(R"({"choices":[],"x":{"usage":{}}})"));             // only the top level counts
  EXPECT_TRUE(is_usage_only_chunk(R"({"choices":[],"usage":{"prompt_tokens":-1}})"));  // whatever its counts
  EXPECT_FALSE(is_usage_only_chunk(R"({"choices":null,"usage":{}})"));
  EXPECT_FALSE(is_usage_only_chunk(R"({"choices":{},"usage":{}})"));
  EXPECT_FALSE(is_usage_only_chunk(R"({"x":{"choices":[]},"choices":[1]})"));  // only the top level counts
  EXPECT_FALSE(is_usage_only_chunk("[DONE]"));
}

// --- ask_for_usage ---

struct Edit {
  bool changed = false;
  api::openai::UsageAsk how = api::openai::UsageAsk::none;
  std::string out;
};
Edit ask(std::string_view body, bool has_stream_options) {
  Edit e;
  std::string scratch;
  e.out = "untouched";
  e.how = ask_for_usage(body, has_stream_options, scratch, e.out);
  e.changed = e.how != api::openai::UsageAsk::none;
  return e;
}

TEST(ApiAskForUsage, WithoutStreamOptionsAddsThemFirst) {
  const std::string body = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true})";
  const auto e = ask(body, false);
  ASSERT_TRUE(e.changed);
  EXPECT_EQ(
      e.out,
      R"({"stream_options":{"include_usage":true},"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true})");
}

TEST(ApiAskForUsage, NullStreamOptionsAreReplaced) {
  const auto e = ask(R"({"model":"m","stream_options":null,"stream":true})", false);  // parse_request: not present
  ASSERT_TRUE(e.changed);
  EXPECT_EQ(e.out, R"({"model":"m","stream_options":{"include_usage":true},"stream":true})");
}

TEST(ApiAskForUsage, AnIncludeUsageThatIsNeitherFalseNorNullIsLeftAlone) {
  // "true" or 1: the upstream reads (vLLM's pydantic) or refuses it; Weir neither rewrites the body
  // nor hides a usage chunk the client may have asked for.
  for (std::string_view body : {R"({"model":"m","stream":true,"stream_options":{"include_usage":"true"}})",
                                R"({"model":"m","stream":true,"stream_options":{"include_usage":1}})",
                                R"({"model":"m","stream":true,"stream_options":{"include_usage":{}}})"}) {
    SCOPED_TRACE(body);
    EXPECT_FALSE(ask(body, true).changed);
  }
  EXPECT_TRUE(ask(R"({"model":"m","stream":true,"stream_options":{"include_usage":null}})", true).changed);
  EXPECT_TRUE(ask(R"({"model":"m","stream":true,"stream_options":{"include_usage":false}})", true).changed);
}

TEST(ApiAskForUsage, StreamOptionsWithoutIncludeUsageSayItsTrueForTheClient) {
  // vLLM defaults include_usage to true there: the client asked for usage. The member is made explicit, so an
  // upstream that reads its absence as OpenAI does (no usage) sends it too; the chunk is the client's.
  auto e = ask(R"({"model":"m","stream":true,"stream_options":{}})", true);
  EXPECT_EQ(e.how, api::openai::UsageAsk::for_client);
  EXPECT_EQ(e.out, R"({"model":"m","stream":true,"stream_options":{"include_usage":true}})");
  e = ask(R"({"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}})", true);
  EXPECT_EQ(e.how, api::openai::UsageAsk::for_client);
  EXPECT_EQ(e.out,
            R"({"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}})");
  // Weir's own asks are for Weir.
  EXPECT_EQ(ask(R"({"model":"m","stream":true})", false).how, api::openai::UsageAsk::for_weir);
  EXPECT_EQ(ask(R"({"model":"m","stream":true,"stream_options":{"include_usage":false}})", true).how,
            api::openai::UsageAsk::for_weir);
}

TEST(ApiAskForUsage, IncludeUsageFalseIsTurnedOnAndEverythingElseKept) {
  const std::string body =
      "{ \"model\" : \"m\",\n  \"stream_options\" : { \"include_usage\" : false },\n  \"stream\":true, \"n\": 2 }";
  const auto e = ask(body, true);
  ASSERT_TRUE(e.changed);
  EXPECT_EQ(
      e.out,
      "{ \"model\" : \"m\",\n  \"stream_options\" : { \"include_usage\" : true },\n  \"stream\":true, \"n\": 2 }");
}

TEST(ApiAskForUsage, ContinuousUsageStatsIsForcedOffWhenPresent) {
  const std::string body =
      R"({"model":"m","stream_options":{"continuous_usage_stats":true,"include_usage":false,"x":[1,{"y":2}]},"stream":true})";
  const auto e = ask(body, true);
  ASSERT_TRUE(e.changed);
  EXPECT_EQ(
      e.out,
      R"({"model":"m","stream_options":{"continuous_usage_stats":false,"include_usage":true,"x":[1,{"y":2}]},"stream":true})");

  // Absent: not added.
  const auto e2 = ask(R"({"model":"m","stream_options":{"include_usage":false}})", true);
  ASSERT_TRUE(e2.changed);
  EXPECT_EQ(e2.out, R"({"model":"m","stream_options":{"include_usage":true}})");
}

TEST(ApiAskForUsage, IncludeUsageOfAnotherTypeIsTurnedOn) {
  const auto e = ask(R"({"model":"m","stream_options":{"include_usage":null}})", true);
  ASSERT_TRUE(e.changed);
  EXPECT_EQ(e.out, R"({"model":"m","stream_options":{"include_usage":true}})");
}

TEST(ApiAskForUsage, EveryOtherByteIsTheClients) {
  // Odd but valid spacing, unicode, escapes and nested look-alike keys.
  const std::string before = "{\"model\":\"m\\u00e9\",\"messages\":[{\"content\":\"\\\"stream_options\\\":{}\"}],";
  const std::string after = ",\"meta\":{\"stream_options\":{\"include_usage\":false}},\"stream\":true}";
  const std::string body = before + "\"stream_options\":\t{\"include_usage\":false}" + after;
  const auto e = ask(body, true);
  ASSERT_TRUE(e.changed);
  EXPECT_EQ(e.out, before + "\"stream_options\":\t{\"include_usage\":true}" + after);
}

TEST(ApiAskForUsage, NotAnObjectIsNotChanged) {
  EXPECT_FALSE(ask("[1,2]", false).changed);
  EXPECT_FALSE(ask("[1,2]", true).changed);
}

TEST(StreamHooks, AnthropicTranslationRewritesEveryEventAndReadsUsage) {
  StreamHooks hooks;
  hooks.reset(false, Translation::anthropic);
  ASSERT_TRUE(hooks.translating());
  http::SseReader reader;
  const std::string wire =
      ": keep-alive\n\n" + event(kContent) +
      event(R"({"id":"c1","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})") +
      event(kUsageOnly) + event("[DONE]");
  reader.push(wire);  // the bytes must outlive the events
  std::string out;
  int translated = 0;
  while (auto ev = reader.next()) translated += hooks.translate(*ev, out) ? 1 : 0;
  EXPECT_EQ(translated, 3);  // the comment and [DONE] give nothing of their own
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_EQ(out.find("data: {\"id\""), std::string::npos);
  EXPECT_NE(out.find("event: message_stop\n"), std::string::npos);
  ASSERT_TRUE(hooks.usage().has_usage());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 7u);
  // Back to a plain stream: pass-through again.
  hooks.reset(true);
  EXPECT_FALSE(hooks.translating());
  EXPECT_FALSE(hooks.done_relayed());
}

TEST(StreamHooks, ResponsesTranslationEndsAtItsTerminalEvent) {
  StreamHooks hooks;
  const std::string echo = R"("store":false)";
  hooks.reset(false, Translation::responses, echo, "req-1");
  ASSERT_TRUE(hooks.translating());
  http::SseReader reader;
  const std::string wire =
      event(kContent) + event(R"({"id":"c1","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})") +
      event(kUsageOnly) + event("[DONE]");
  reader.push(wire);
  std::string out;
  while (auto ev = reader.next()) (void)hooks.translate(*ev, out);
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_NE(out.find("event: response.completed\n"), std::string::npos);
  EXPECT_EQ(out.find("[DONE]"), std::string::npos);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 7u);
  // A failure after the terminal event adds nothing.
  const std::size_t size = out.size();
  hooks.fail(502, "late", out);
  EXPECT_EQ(out.size(), size);
  // A failure mid-stream: response.failed.
  hooks.reset(false, Translation::responses, echo, "req-2");
  out.clear();
  hooks.fail(504, "timed out", out);
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_NE(out.find("event: response.failed\n"), std::string::npos);
  hooks.reset(false);
  EXPECT_FALSE(hooks.translating());
}

// An Anthropic upstream's stream (Anthropic's documented text stream, cut short of nothing).
constexpr std::string_view kAnthropicStream =
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\","
    "\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\"usage\":{\"input_tokens\":25,"
    "\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\n"
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
    "\"text\",\"text\":\"\"}}\n\n"
    "event: ping\ndata: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
    "\"text_delta\",\"text\":\"Hello\"}}\n\n"
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":"
    "{\"output_tokens\":15}}\n\n"
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

std::string translated(StreamHooks& hooks, std::string_view wire) {
  http::SseReader reader;
  reader.push(wire);
  std::string out;
  while (auto ev = reader.next()) (void)hooks.translate(*ev, out);
  return out;
}

TEST(GatewayStreamHooks, AnthropicUpstreamToAChatClient) {
  StreamHooks hooks;
  hooks.reset(StreamHooks::Setup{
      .client = Translation::none, .upstream = UpstreamDialect::anthropic, .include_usage = false, .created = 42});
  ASSERT_TRUE(hooks.translating());
  EXPECT_TRUE(hooks.openai_client());
  const std::string out = translated(hooks, kAnthropicStream);
  EXPECT_TRUE(out.starts_with("data: {\"id\":\"chatcmpl-msg_1\",\"object\":\"chat.completion.chunk\",\"created\":42"))
      << out;
  EXPECT_NE(out.find(R"("delta":{"content":"Hello"})"), std::string::npos);
  EXPECT_NE(out.find(R"("finish_reason":"stop")"), std::string::npos);
  EXPECT_EQ(out.find(R"("usage")"), std::string::npos);  // not asked for, still counted:
  EXPECT_TRUE(out.ends_with("data: [DONE]\n\n"));
  EXPECT_TRUE(hooks.done_relayed());
  ASSERT_TRUE(hooks.usage().has_usage());
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 30u);
  EXPECT_EQ(hooks.usage().usage().cached_tokens, 5u);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 15u);
  http::SseReader r;
  r.push("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n");
  const auto ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(hooks.classify(*ev), api::openai::ChunkKind::error);
}

TEST(GatewayStreamHooks, AnthropicUpstreamToAnAnthropicClientPassesEveryByte) {
  StreamHooks hooks;
  hooks.reset(StreamHooks::Setup{.client = Translation::anthropic, .upstream = UpstreamDialect::anthropic});
  ASSERT_TRUE(hooks.translating());
  EXPECT_FALSE(hooks.openai_client());
  EXPECT_EQ(translated(hooks, kAnthropicStream), kAnthropicStream);
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_EQ(hooks.usage().usage().prompt_tokens, 30u);
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 15u);
  std::string out;
  hooks.fail(502, "late", out);  // after message_stop: nothing
  EXPECT_TRUE(out.empty());
  // Cut short before message_stop: one error event closes it.
  hooks.reset(StreamHooks::Setup{.client = Translation::anthropic, .upstream = UpstreamDialect::anthropic});
  out = translated(hooks, kAnthropicStream.substr(0, kAnthropicStream.find("event: message_delta")));
  EXPECT_FALSE(hooks.done_relayed());
  hooks.finish(out);
  EXPECT_TRUE(
      out.ends_with("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":"
                    "\"The upstream stream ended before the message was complete.\"}}\n\n"))
      << out;
}

TEST(GatewayStreamHooks, AnthropicUpstreamToAResponsesClient) {
  StreamHooks hooks;
  const std::string echo = R"("store":false)";
  hooks.reset(StreamHooks::Setup{.client = Translation::responses,
                                 .upstream = UpstreamDialect::anthropic,
                                 .created = 42,
                                 .echo = echo,
                                 .request_id = "req-1",
                                 .model = "m"});
  EXPECT_FALSE(hooks.openai_client());
  const std::string out = translated(hooks, kAnthropicStream);
  EXPECT_TRUE(out.starts_with("event: response.created\n")) << out;
  EXPECT_NE(out.find(R"("delta":"Hello")"), std::string::npos) << out;
  EXPECT_NE(out.find("event: response.completed\n"), std::string::npos);
  EXPECT_NE(out.find(R"("id":"resp_msg_1")"), std::string::npos);
  EXPECT_NE(out.find(R"("input_tokens":30,"input_tokens_details":{"cached_tokens":5)"), std::string::npos) << out;
  EXPECT_TRUE(hooks.done_relayed());
  EXPECT_EQ(hooks.usage().usage().completion_tokens, 15u);
}

}  // namespace
}  // namespace weir::gateway
