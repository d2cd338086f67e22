// What one streamed chunk carries (api/openai/stream.hpp: classify_chunk):
// named cases, then the reader against a DOM walk of the same chunk (the
// implementation before the SAX reader, kept here as the oracle) over
// chunks built from the members the verdict reads, duplicates and wrong
// types included, and over byte-level mutations of real vLLM chunks.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <random>
#include <string>
#include <vector>

#include "api/json_dom.hpp"
#include "api/openai/stream.hpp"

namespace weir::api::openai {
namespace {

namespace json = boost::json;

ChunkKind dom_classify(std::string_view data) {
  boost::system::error_code ec;
  const json::value v = json::parse(json::string_view(data.data(), data.size()), ec);
  if (ec || !v.is_object()) return ChunkKind::error;
  const auto& o = v.get_object();
  if (const auto* e = o.if_contains("error"); e && truthy(*e)) return ChunkKind::error;
  if (const auto* t = o.if_contains("object"); t && t->is_string() && t->get_string() == "error")
    return ChunkKind::error;
  const auto* choices = o.if_contains("choices");
  if (!choices || !choices->is_array()) return ChunkKind::empty;
  auto non_empty_string = [](const json::value* s) { return s && s->is_string() && !s->get_string().empty(); };
  for (const auto& c : choices->get_array()) {
    if (!c.is_object()) continue;
    const auto& co = c.get_object();
    if (const auto* f = co.if_contains("finish_reason"); f && !f->is_null()) return ChunkKind::content;
    if (non_empty_string(co.if_contains("text"))) return ChunkKind::content;
    const auto* d = co.if_contains("delta");
    if (!d || !d->is_object()) continue;
    const auto& delta = d->get_object();
    for (const char* k : {"content", "refusal", "reasoning_content", "reasoning"})
      if (non_empty_string(delta.if_contains(k))) return ChunkKind::content;
    // (content as a list of parts, as Mistral sends it)
    if (const auto* c = delta.if_contains("content"); c && c->is_array() && !c->get_array().empty())
      return ChunkKind::content;
    if (const auto* t = delta.if_contains("tool_calls"); t && t->is_array() && !t->get_array().empty())
      return ChunkKind::content;
  }
  return ChunkKind::empty;
}

constexpr std::string_view kRole =
    R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,)"
    R"("delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})";
constexpr std::string_view kToken =
    R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,)"
    R"("delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]})";
constexpr std::string_view kUsage =
    R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],)"
    R"("usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}})";

TEST(ClassifyChunk, NamedCases) {
  EXPECT_EQ(classify_chunk(kRole), ChunkKind::empty);
  EXPECT_EQ(classify_chunk(kToken), ChunkKind::content);
  EXPECT_EQ(classify_chunk(kUsage), ChunkKind::empty);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"text":"a"}]})"), ChunkKind::content);  // completions
  EXPECT_EQ(classify_chunk(R"({"choices":[{"text":""}]})"), ChunkKind::empty);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{},"finish_reason":"stop"}]})"), ChunkKind::content);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"tool_calls":[{"index":0}]}}]})"), ChunkKind::content);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"tool_calls":[]}}]})"), ChunkKind::empty);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"reasoning_content":"x"}}]})"), ChunkKind::content);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"reasoning":"x"}}]})"), ChunkKind::content);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"refusal":"no"}}]})"), ChunkKind::content);
  // Mistral's content parts: a list that is not empty is content (the first token), an empty one none.
  constexpr std::string_view kParts = R"({"choices":[{"delta":{"content":[{"type":"text","text":"42"}]}}]})";
  EXPECT_EQ(classify_chunk(kParts), ChunkKind::content);
  EXPECT_TRUE(looks_like_content(kParts));
  EXPECT_TRUE(chunk_has_tokens(kParts));
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"content":[]}}]})"), ChunkKind::empty);
  EXPECT_FALSE(looks_like_content(R"({"choices":[{"delta":{"content":[ ]}}]})"));
  EXPECT_EQ(classify_chunk(R"({"error":{"message":"boom","code":500}})"), ChunkKind::error);
  EXPECT_EQ(classify_chunk(R"({"object":"error","message":"boom"})"), ChunkKind::error);
  // A falsy `error` (null, false, 0, "", {}, []) is no error: the openai SDK raises on a truthy one only.
  for (const char* falsy : {"null", "false", "0", "0.0", "\"\"", "{}", "[]"})
    EXPECT_EQ(classify_chunk(std::string(R"({"error":)") + falsy + R"(,"choices":[{"delta":{"content":"x"}}]})"),
              ChunkKind::content)
        << falsy;
  for (const char* truthy : {"true", "1", "-1", "0.5", "\"x\"", "{\"a\":1}", "[0]"})
    EXPECT_EQ(classify_chunk(std::string(R"({"error":)") + truthy + "}"), ChunkKind::error) << truthy;
  EXPECT_EQ(classify_chunk(R"({"error":{"message":"boom"},"error":null,"choices":[]})"), ChunkKind::empty);
  EXPECT_EQ(classify_chunk(R"({"error":null,"error":{"message":"boom"}})"), ChunkKind::error);
  EXPECT_EQ(classify_chunk(R"({"object":"err\u006fr"})"), ChunkKind::error);  // escapes are read as text
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"c\u006fntent":"x"}}]})"), ChunkKind::content);
  EXPECT_EQ(classify_chunk("[]"), ChunkKind::error);
  EXPECT_EQ(classify_chunk("\"x\""), ChunkKind::error);
  EXPECT_EQ(classify_chunk("{"), ChunkKind::error);
  EXPECT_EQ(classify_chunk(""), ChunkKind::error);
  EXPECT_EQ(classify_chunk(R"({"choices":[]} x)"), ChunkKind::error);  // data after the object
  EXPECT_EQ(classify_chunk(" {\"choices\":[{\"text\":\"a\"}]}\n"), ChunkKind::content);
  EXPECT_EQ(classify_chunk("{\"choices\":[{\"text\":\"\xff\"}]}"), ChunkKind::error);  // invalid UTF-8
  // A repeated member: its last value counts (boost::json::object, Python's json).
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"content":"a","content":""}}]})"), ChunkKind::empty);
  EXPECT_EQ(classify_chunk(R"({"choices":[{"delta":{"content":"a"}}],"choices":[]})"), ChunkKind::empty);
  EXPECT_EQ(classify_chunk(R"({"choices":[],"choices":[{"text":"a"}]})"), ChunkKind::content);
  EXPECT_EQ(classify_chunk(R"({"object":"error","object":"chunk","choices":[]})"), ChunkKind::empty);
  // Deeper than Boost.JSON's max_depth (32): invalid, as the DOM parse says.
  EXPECT_EQ(classify_chunk(std::string(40, '[') + std::string(40, ']')), ChunkKind::error);
}

// A value for a member, from a small alphabet of shapes (recursing into the members the verdict reads).
class ChunkMaker {
 public:
  explicit ChunkMaker(std::uint32_t seed) : rng_(seed) {}

  std::string root() {
    std::string s = "{";
    member_list(s, {"id", "object", "choices", "error", "usage", "model"}, 0);
    return s + "}";
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  void member_list(std::string& s, const std::vector<std::string>& names, int depth) {
    const int n = pick(5);
    for (int i = 0; i < n; ++i) {
      if (i) s += ",";
      const std::string& k = names[pick(static_cast<int>(names.size()))];
      s += "\"" + k + "\":";
      value_for(s, k, depth);
    }
  }
  void scalar(std::string& s) {
    static const char* kScalars[] = {"\"\"",  "\"x\"", "\"error\"", "null",       "0",   "1.5",      "true",
                                     "false", "{}",    "[]",        "\"errors\"", "[1]", "{\"a\":1}"};
    s += kScalars[pick(13)];
  }
  void value_for(std::string& s, const std::string& k, int depth) {
    if (depth > 4 || pick(3) == 0) return scalar(s);
    if (k == "choices") {
      s += "[";
      const int n = pick(4);
      for (int i = 0; i < n; ++i) {
        if (i) s += ",";
        if (pick(4) == 0) {
          scalar(s);
        } else {
          s += "{";
          member_list(s, {"index", "delta", "text", "finish_reason", "logprobs"}, depth + 1);
          s += "}";
        }
      }
      s += "]";
    } else if (k == "delta") {
      s += "{";
      member_list(s, {"role", "content", "refusal", "reasoning_content", "reasoning", "tool_calls"}, depth + 1);
      s += "}";
    } else if (k == "tool_calls") {
      s += pick(2) ? "[{\"index\":0}]" : "[]";
    } else {
      scalar(s);
    }
  }

  std::mt19937 rng_;
};

TEST(ClassifyChunk, AgreesWithDomOnBuiltChunks) {
  ChunkMaker make(20261204);
  int kinds[3] = {};
  for (int i = 0; i < 20000; ++i) {
    const std::string chunk = make.root();
    const ChunkKind want = dom_classify(chunk);
    ASSERT_EQ(classify_chunk(chunk), want) << chunk;
    ++kinds[static_cast<int>(want)];
  }
  // The corpus reaches every verdict often.
  for (int k : kinds) EXPECT_GT(k, 500) << kinds[0] << " empty, " << kinds[1] << " content, " << kinds[2] << " error";
}

TEST(ClassifyChunk, AgreesWithDomOnMutatedChunks) {
  std::mt19937 rng(7);
  const std::string seeds[] = {std::string(kRole), std::string(kToken), std::string(kUsage),
                               R"({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]})",
                               R"({"error":{"message":"x"}})"};
  const std::string alphabet = "{}[]\",:\\ ntrufalse0123456789ex\xc3\xa9\xff";
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[i % 5];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % (s.size() + 1);
      switch (rng() % 3) {
        case 0:
          if (at < s.size()) s.erase(at, 1);
          break;
        case 1:
          s.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          if (at < s.size()) s[at] = alphabet[rng() % alphabet.size()];
      }
    }
    ASSERT_EQ(classify_chunk(s), dom_classify(s)) << s;
  }
}

// looks_like_content, the first-token test of a stream that is not held: never a content chunk missed (on the
// built corpus, with its duplicates and wrong types, and on mutations), and exactly classify_chunk's verdict on
// chunks as servers write them.
TEST(LooksLikeContent, NeverMissesWhatClassifyCallsContent) {
  ChunkMaker make(20261207);
  int content = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string chunk = make.root();
    if (classify_chunk(chunk) != ChunkKind::content) continue;
    ++content;
    ASSERT_TRUE(looks_like_content(chunk)) << chunk;
  }
  EXPECT_GT(content, 1000);
  std::mt19937 rng(9);
  const std::string alphabet = "{}[]\",: ntrufalse0123456789ex";
  for (int i = 0; i < 20000; ++i) {
    std::string s = i % 2 ? std::string(kRole) : std::string(kToken);
    s.insert(rng() % (s.size() + 1), 1, alphabet[rng() % alphabet.size()]);
    if (classify_chunk(s) == ChunkKind::content) {
      ASSERT_TRUE(looks_like_content(s)) << s;
    }
  }
}

// A chunk as vLLM, OpenAI or a Python server (`", "` and `": "` separators) writes it.
std::string served_chunk(std::mt19937& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  static const char* kTexts[] = {"",      "Hel",           " a: b",    "x\\\"y:\\n", "\\u4e2d", "content",
                                 "text:", "\\\"text\\\":", "\xc3\xa9", "reasoning",  ": \\\""};
  const bool py = pick(2) == 0;
  const std::string colon = py ? ": " : ":";
  const std::string comma = py ? ", " : ",";
  auto str = [&](const char* t) { return std::string("\"") + t + "\""; };
  auto text = [&] { return str(kTexts[pick(11)]); };
  std::string delta;
  switch (pick(7)) {
    case 0:
      delta = "\"role\"" + colon + "\"assistant\"" + comma + "\"content\"" + colon + (pick(2) ? "\"\"" : "null");
      break;
    case 1:
      delta = "\"content\"" + colon + text();
      break;
    case 2:
      delta = "\"role\"" + colon + "\"assistant\"" + comma + "\"content\"" + colon + "\"\"" + comma + "\"refusal\"" +
              colon + (pick(2) ? "null" : text());
      break;
    case 3:
      delta = "\"reasoning_content\"" + colon + text() + comma + "\"reasoning\"" + colon + text();
      break;
    case 4:
      delta = "\"tool_calls\"" + colon +
              (pick(2) ? std::string("[]")
                       : "[{\"index\"" + colon + "0" + comma + "\"id\"" + colon + text() + comma + "\"function\"" +
                             colon + "{\"name\"" + colon + text() + comma + "\"arguments\"" + colon + text() + "}}]");
      break;
    case 5:
      delta = "";
      break;
    default:
      delta = "\"content\"" + colon + "null" + comma + "\"tool_calls\"" + colon + "null";
  }
  const std::string finish = pick(3) == 0 ? str(pick(2) ? "stop" : "length") : "null";
  std::string choice;
  if (pick(5) == 0) {  // a completions chunk
    choice = "{\"index\"" + colon + "0" + comma + "\"text\"" + colon + text() + comma + "\"logprobs\"" + colon +
             "null" + comma + "\"finish_reason\"" + colon + finish + "}";
  } else {
    choice = "{\"index\"" + colon + "0" + comma + "\"delta\"" + colon + "{" + delta + "}" + comma + "\"logprobs\"" +
             colon + "null" + comma + "\"finish_reason\"" + colon + finish + "}";
  }
  std::string choices = pick(6) == 0 ? "[]" : "[" + choice + (pick(4) == 0 ? comma + choice : "") + "]";
  std::string out = "{\"id\"" + colon + str("chatcmpl-1") + comma + "\"object\"" + colon +
                    str("chat.completion.chunk") + comma + "\"created\"" + colon + "1" + comma + "\"model\"" + colon +
                    text() + comma + "\"choices\"" + colon + choices;
  if (pick(4) == 0) out += comma + "\"usage\"" + colon + (pick(2) ? "null" : "{\"prompt_tokens\":5}");
  if (pick(8) == 0)
    out += comma + "\"prompt_filter_results\"" + colon + "[{\"content_filter_results\"" + colon + "{}}]";
  return out + "}";
}

TEST(LooksLikeContent, AnswersAsClassifyOnServedChunks) {
  std::mt19937 rng(20261207);
  int kinds[2] = {};
  for (int i = 0; i < 40000; ++i) {
    const std::string chunk = served_chunk(rng);
    const ChunkKind want = classify_chunk(chunk);
    ASSERT_NE(want, ChunkKind::error) << chunk;
    ASSERT_EQ(looks_like_content(chunk), want == ChunkKind::content) << chunk;
    ++kinds[want == ChunkKind::content];
  }
  EXPECT_GT(kinds[0], 5000);
  EXPECT_GT(kinds[1], 5000);
  EXPECT_FALSE(looks_like_content(kRole));
  EXPECT_TRUE(looks_like_content(kToken));
  EXPECT_FALSE(looks_like_content(kUsage));
  EXPECT_FALSE(looks_like_content(R"({"error":{"message":"bad","type":"BadRequestError","code":400}})"));
  EXPECT_FALSE(looks_like_content(R"({"choices" : [{"delta" : {"content" : ""}, "finish_reason" : null}]})"));
  EXPECT_TRUE(looks_like_content(R"({"choices" : [{"delta" : {"content" : "a"}}]})"));
  EXPECT_TRUE(looks_like_content(R"({"choices":[{"delta":{"tool_calls":[ ]}, "finish_reason":"stop"}]})"));
  EXPECT_FALSE(looks_like_content(R"({"choices":[{"delta":{"tool_calls":[ ]}}]})"));
  EXPECT_TRUE(looks_like_content(R"({"choices":[{"delta":{"c\u006fntent":"a"}}]})"));  // escaped: parsed
}

}  // namespace
}  // namespace weir::api::openai

namespace weir::api::openai {
namespace {

TEST(RefusesRequest, FourHundredsOtherThanTimeoutAndOverload) {
  EXPECT_TRUE(
      refuses_request(R"({"error":{"message":"bad schema","type":"BadRequestError","param":null,"code":400}})"));
  EXPECT_TRUE(refuses_request(R"({"object":"error","message":"x","type":"BadRequestError","code":400})"));
  EXPECT_TRUE(refuses_request(R"({"error":{"message":"x","type":"x","code":"404"}})"));
  EXPECT_TRUE(
      refuses_request(R"({"error":{"message":"x","type":"invalid_request_error","code":"context_length_exceeded"}})"));
  EXPECT_TRUE(refuses_request(R"({"type":"error","error":{"type":"invalid_request_error","message":"x"}})"));
  EXPECT_FALSE(refuses_request(R"({"error":{"message":"x","type":"BadRequestError","code":429}})"));
  EXPECT_FALSE(refuses_request(R"({"error":{"message":"x","type":"x","code":408}})"));
  EXPECT_FALSE(refuses_request(R"({"error":{"message":"x","type":"InternalServerError","code":500}})"));
  EXPECT_FALSE(refuses_request(R"({"type":"error","error":{"type":"overloaded_error","message":"x"}})"));
  EXPECT_FALSE(refuses_request(R"({"error":{"message":"x"}})"));
  EXPECT_FALSE(refuses_request(R"({"error":"x"})"));
  EXPECT_FALSE(refuses_request("not json"));
  // A status code decides before the type: an engine's 500 named BadRequestError is the engine's.
  EXPECT_FALSE(refuses_request(R"({"error":{"type":"BadRequestError","code":500}})"));
}

}  // namespace
}  // namespace weir::api::openai

namespace weir::api::openai {
namespace {

TEST(UsageHookWithoutUsage, DropsTheMemberWeirAskedForFromAChunkWithChoices) {
  UsageHook h;
  std::string scratch;
  h.reset(true);
  const std::string_view fin =
      R"({"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
  EXPECT_TRUE(h.on_data(fin));
  EXPECT_EQ(h.usage().completion_tokens, 2u);
  EXPECT_EQ(h.without_usage(fin, scratch).value(),
            R"({"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})");
  const std::string_view first = R"({"usage":{"prompt_tokens":1} , "id":"x","choices":[]})";
  EXPECT_EQ(h.without_usage(first, scratch).value(), R"({ "id":"x","choices":[]})");
  EXPECT_FALSE(h.without_usage(R"({"id":"x","choices":[],"usage":null})", scratch));
  EXPECT_FALSE(h.without_usage(R"({"id":"x","choices":[]})", scratch));
  // A usage key given twice: both copies go (the first too, which a first-wins parser would read).
  const std::string_view twice =
      R"({"id":"x","usage":{"prompt_tokens":9},"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
  EXPECT_TRUE(h.on_data(twice));
  EXPECT_EQ(h.without_usage(twice, scratch).value(),
            R"({"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})");
  h.reset(false);  // the client asked: its chunk as it came
  EXPECT_FALSE(h.without_usage(fin, scratch));
}

TEST(UsageHookInvalid, AUsageChunkOutOfRangeIsNoUsageAndSaysSo) {
  // 2^31 prompt tokens in the usage-only chunk: billed as sent it sank the tenant's bucket and budget.
  UsageHook h;
  h.reset(true);
  EXPECT_FALSE(h.on_data(R"({"id":"x","choices":[],"usage":{"prompt_tokens":2147483648,"completion_tokens":2}})"));
  EXPECT_FALSE(h.has_usage());
  EXPECT_TRUE(h.invalid());
  h.reset(true);  // (a new stream: nothing said)
  EXPECT_FALSE(h.invalid());
  EXPECT_FALSE(h.on_data(R"({"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}})"));
  EXPECT_TRUE(h.has_usage());
  EXPECT_FALSE(h.invalid());
}

}  // namespace
}  // namespace weir::api::openai

namespace weir::api::openai {
namespace {

// A chunk with only a finish_reason is a content event (the first token, for TTFT) but carries no token
// (the fallback count of a stream without usage).
TEST(ChunkTokens, AFinishWithAnEmptyDeltaCarriesNone) {
  for (std::string_view c : {R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})",
                             R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})",
                             R"({"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]})",
                             R"({"choices":[]})", R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})"}) {
    EXPECT_FALSE(chunk_has_tokens(c)) << c;
  }
  EXPECT_EQ(classify_chunk(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})"), ChunkKind::content);
  for (std::string_view c : {R"({"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]})",
                             R"({"choices":[{"index":0,"text":"x","finish_reason":null}]})",
                             R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"finish_reason":null}]})",
                             R"({"choices":[{"index":0,"delta":{}},{"index":1,"delta":{"reasoning":"r"}}]})"}) {
    EXPECT_TRUE(chunk_has_tokens(c)) << c;
  }
  EXPECT_FALSE(chunk_has_tokens("not json"));
}

TEST(ChunkTokens, OnlyAChunkWithAFinishReasonValueIsParsed) {
  EXPECT_FALSE(may_be_finish_only(R"({"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]})"));
  EXPECT_FALSE(may_be_finish_only(R"({"choices":[{"index":0,"delta":{"content":"x"},"finish_reason" : null}]})"));
  EXPECT_FALSE(may_be_finish_only(R"({"choices":[{"index":0,"delta":{"content":"x"}}]})"));
  EXPECT_TRUE(may_be_finish_only(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})"));
  EXPECT_TRUE(may_be_finish_only(R"({"choices":[{"index":0,"delta":{},"finish_reason": "stop"}]})"));
  // A member of that name elsewhere costs a parse only (a text cannot hold it: its quotes are escaped).
  const std::string_view other =
      R"({"choices":[{"delta":{"content":"x"},"finish_reason":null}],"x":{"finish_reason":1}})";
  EXPECT_TRUE(may_be_finish_only(other));
  EXPECT_TRUE(chunk_has_tokens(other));
  EXPECT_FALSE(may_be_finish_only(R"({"choices":[{"delta":{"content":"\"finish_reason\": \"x\""}}]})"));
}

}  // namespace
}  // namespace weir::api::openai
