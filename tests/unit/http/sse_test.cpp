// SseReader against a byte-at-a-time reference parser, on recorded streams cut
// at every split point (every pair for short streams, random multi-splits and
// 1-byte pushes for long ones), plus targeted cases and an allocation count.
#include "http/sse.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "alloc_counter.hpp"

namespace weir::http {
namespace {

using namespace std::string_view_literals;

constexpr std::string_view kBom = "\xEF\xBB\xBF";
constexpr std::size_t kNoLimit = 4u << 20;

// ---------------------------------------------------------------------------
// Recorded streams.

// A vLLM 0.6 /v1/chat/completions stream with stream_options.include_usage:
// role delta, content deltas with multi-byte UTF-8 (2-, 3- and 4-byte
// sequences), escaped quotes and backslashes, the finish chunk, the usage
// chunk with "choices":[], and the [DONE] sentinel. LF line endings, as vLLM
// (FastAPI StreamingResponse) sends them.
constexpr std::string_view kVllmChat =
    R"(data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":"Caf"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":"é in"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" 日本"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" 😀"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" \"quoted\" back\\slash\n"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}

data: {"id":"chatcmpl-3f9c0b6e2d4a4c1f9e8b7a6d5c4b3a29","object":"chat.completion.chunk","created":1718035200,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":400,"total_tokens":407,"completion_tokens":7}}

data: [DONE]

)";

// The same shape, short enough to cut at every pair of points.
constexpr std::string_view kVllmShort =
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"é日😀\\\"\"}}]}\n\n"
    "data: "
    "{\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"total_tokens\":5,\"completion_tokens\":1}}\n\n"
    "data: [DONE]\n\n";

constexpr std::string_view kCrlf =
    "data: {\"a\":\"é\"}\r\n\r\n"
    ": ping\r\n\r\n"
    "event: message\r\nid: 7\r\ndata: one\r\ndata: two\r\n\r\n"
    "data: [DONE]\r\n\r\n";

constexpr std::string_view kCrOnly =
    "data: first\r\r"
    ": comment\r\r"
    "event: update\rdata: x\rdata: y\rid: 9\r\r"
    "data: 日本\r\r"
    "data: [DONE]\r\r";

constexpr std::string_view kMixed =
    "data: a\r\n\n"  // CRLF then LF
    "data: b\n\r"    // LF then CR
    "data: c\r\r\n"  // CR then CRLF
    "data: d\ndata: e\r\n\r\n"
    "\n"  // a stray blank line: an empty event of its own
    "data: f\r\n\r\n";

// Field-syntax corner cases from WHATWG §9.2.6.
constexpr std::string_view kFields =
    ": ping\n\n"                           // comment-only block
    ":\n\n"                                // empty comment
    "data:nospace\n\n"                     // no space after the colon
    "data:  two spaces\n\n"                // only one space is removed
    "data\n\n"                             // field name without a colon: data with empty value
    "data:\n\n"                            // empty data
    "data: line1\ndata:\ndata: line3\n\n"  // multi-line data with an empty line inside
    "event: custom\nid: 42\nretry: 3000\ndata: payload\n\n"
    "event: first\nevent: second\nid: a\nid: b\ndata: x\n\n"  // last one wins
    "id: bad\0id\ndata: nul\n\n"sv                            // id with NUL is ignored
    "foo: bar\n: comment\ndata: kept\nDATA: case-sensitive\n\n"
    "event: no-data\n\n"  // no data line: has_data == false
    "event\nid\ndata: empty event and id\n\n"
    "data: colon: inside: value\n\n"
    "\n\n"                    // blank lines on their own
    "data: tail-incomplete";  // no terminating blank line: stays pending

constexpr std::string_view kBomStream =
    "\xEF\xBB\xBF"
    "data: after bom\n\n"
    "\xEF\xBB\xBF"
    "data: second bom is a field name\n\n"
    "data: end\n\n";

constexpr std::string_view kBomLookalike =
    "\xEF\xBB"
    "data: not a bom\n\n"
    "data: ok\n\n";

// A BOM prefix cut short by a line break: the bytes are a (nameless) line.
constexpr std::string_view kBomThenNewline =
    "\xEF\xBB\n\n"
    "\xEF\r\n"
    "data: x\n\n";

struct StreamCase {
  const char* name;
  std::string_view text;
  std::size_t max_event_bytes;
};

void PrintTo(const StreamCase& sc, std::ostream* os) { *os << sc.name; }

std::vector<StreamCase> short_streams() {
  return {
      {"VllmShort", kVllmShort, kNoLimit},
      {"Crlf", kCrlf, kNoLimit},
      {"CrOnly", kCrOnly, kNoLimit},
      {"Mixed", kMixed, kNoLimit},
      {"Fields", kFields, kNoLimit},
      {"Bom", kBomStream, kNoLimit},
      {"BomLookalike", kBomLookalike, kNoLimit},
      {"BomThenNewline", kBomThenNewline, kNoLimit},
      // Events of 9, 10 and 11 bytes against a 10-byte limit: the third overflows.
      {"Oversized", "data: a\n\ndata: ab\n\ndata: abc\n\ndata: never\n\n", 10},
      {"OversizedCr", "data: a\r\rdata: ab\r\ndata: abc\r\n\r\n", 10},
      {"OversizedIncomplete", "data: a\n\ndata: this line never ends", 12},
  };
}

std::vector<StreamCase> long_streams() {
  return {
      {"VllmChat", kVllmChat, kNoLimit},
      // Its largest event is 264 bytes (the escaped-quotes chunk): exactly at
      // the limit it passes, 2 bytes under it the stream fails there.
      {"VllmChatAtLimit", kVllmChat, 264},
      {"VllmChatOverLimit", kVllmChat, 262},
  };
}

// ---------------------------------------------------------------------------
// Owned copies of events, and what a run produced.

struct Ev {
  std::string raw;
  std::string data;
  std::string type;
  std::string id;
  bool has_data = false;
  bool operator==(const Ev&) const = default;
};

void PrintTo(const Ev& e, std::ostream* os) {
  *os << "{raw=" << ::testing::PrintToString(e.raw) << " data=" << ::testing::PrintToString(e.data)
      << " type=" << ::testing::PrintToString(e.type) << " id=" << ::testing::PrintToString(e.id)
      << " has_data=" << e.has_data << "}";
}

struct Outcome {
  std::vector<Ev> events;
  std::size_t pending = 0;
  bool overflow = false;
  bool operator==(const Outcome&) const = default;
};

void PrintTo(const Outcome& o, std::ostream* os) {
  *os << "{" << o.events.size() << " events, pending=" << o.pending << ", overflow=" << o.overflow << "}";
}

// ---------------------------------------------------------------------------
// Reference parser: one byte at a time, straight from WHATWG §9.2.6. It is
// told where the pushes start only to model the one split-dependent rule: the
// CR that ends an event's empty line, when it is the last byte of a push, ends
// the event there, and an LF starting the next push goes to the next event.

Outcome reference_parse(std::string_view in, const std::vector<std::size_t>& cuts, std::size_t max) {
  std::vector<bool> push_starts(in.size() + 1, false);
  for (std::size_t c : cuts) push_starts[c] = true;

  Outcome out;
  Ev cur;
  std::string line;
  std::string data;
  bool after_cr = false;

  const auto field = [&](const std::string& l) {
    if (l[0] == ':') return;
    const std::size_t colon = l.find(':');
    const std::string name = l.substr(0, colon);
    std::string value = colon == std::string::npos ? "" : l.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.erase(0, 1);
    if (name == "data") {
      data += value;
      data += '\n';
      cur.has_data = true;
    } else if (name == "event") {
      cur.type = value;
    } else if (name == "id") {
      if (value.find('\0') == std::string::npos) cur.id = value;
    }
  };

  // The event that outgrows the limit is never returned; those before it are.
  const auto overflowed = [&] {
    out.overflow = true;
    out.pending = 0;
    return out;
  };

  std::size_t i = in.substr(0, 3) == kBom ? 3 : 0;
  for (; i < in.size(); ++i) {
    const char c = in[i];
    if (after_cr) {
      after_cr = false;
      if (c == '\n') {
        cur.raw += c;
        if (cur.raw.size() > max) return overflowed();
        continue;
      }
    }
    cur.raw += c;
    if (cur.raw.size() > max) return overflowed();
    if (c != '\r' && c != '\n') {
      line += c;
      continue;
    }
    after_cr = c == '\r';
    if (!line.empty()) {
      field(line);
      line.clear();
      continue;
    }
    // The empty line: the event ends. A CR takes its LF along if both are in one push.
    if (c == '\r' && i + 1 < in.size() && in[i + 1] == '\n' && !push_starts[i + 1]) {
      cur.raw += '\n';
      ++i;
      after_cr = false;
      if (cur.raw.size() > max) return overflowed();
    }
    if (cur.has_data) cur.data = data.substr(0, data.size() - 1);
    out.events.push_back(std::move(cur));
    cur = Ev{};
    data.clear();
  }
  out.pending = cur.raw.size();
  return out;
}

// ---------------------------------------------------------------------------
// Runs SseReader over `in` pushed in pieces that start at `cuts` (sorted).
// Each piece lives in its own heap buffer, poisoned and freed once next() has
// returned nullopt, so a view kept across pushes shows up as wrong bytes (or
// as use-after-free under ASan).

Outcome run_reader(std::string_view in, const std::vector<std::size_t>& cuts, std::size_t max,
                   std::string* concat_raw = nullptr) {
  SseReader reader(max);
  Outcome out;
  std::size_t prev = 0;
  const auto feed = [&](std::size_t from, std::size_t to) {
    std::vector<char> piece(in.begin() + static_cast<std::ptrdiff_t>(from),
                            in.begin() + static_cast<std::ptrdiff_t>(to));
    reader.push({piece.data(), piece.size()});
    while (auto ev = reader.next()) {
      out.events.push_back(
          Ev{std::string(ev->raw), std::string(ev->data), std::string(ev->type), std::string(ev->id), ev->has_data});
      if (concat_raw) concat_raw->append(ev->raw);
    }
    std::fill(piece.begin(), piece.end(), '#');
  };
  for (std::size_t c : cuts) {
    feed(prev, c);
    prev = c;
  }
  feed(prev, in.size());
  out.pending = reader.pending_bytes();
  out.overflow = reader.error();
  return out;
}

std::string describe_cuts(const std::vector<std::size_t>& cuts) {
  std::string s = "cuts at {";
  for (std::size_t c : cuts) s += std::to_string(c) + ",";
  return s + "}";
}

// Compares the reader with the reference for one way of cutting the stream,
// and checks that raw views plus the pending tail are the stream exactly.
::testing::AssertionResult same_as_reference(const StreamCase& sc, const std::vector<std::size_t>& cuts) {
  std::string concat;
  const Outcome got = run_reader(sc.text, cuts, sc.max_event_bytes, &concat);
  const Outcome want = reference_parse(sc.text, cuts, sc.max_event_bytes);
  if (got != want) {
    std::string msg = describe_cuts(cuts) + ": reader " + ::testing::PrintToString(got) + " vs reference " +
                      ::testing::PrintToString(want);
    for (std::size_t i = 0; i < std::min(got.events.size(), want.events.size()); ++i) {
      if (!(got.events[i] == want.events[i])) {
        msg += "; first difference at event " + std::to_string(i) + ": " + ::testing::PrintToString(got.events[i]) +
               " vs " + ::testing::PrintToString(want.events[i]);
        break;
      }
    }
    return ::testing::AssertionFailure() << msg;
  }
  if (!got.overflow) {
    const std::size_t bom = sc.text.substr(0, 3) == kBom ? 3 : 0;
    const std::string_view expected = sc.text.substr(bom, sc.text.size() - bom - got.pending);
    if (concat != expected) {
      return ::testing::AssertionFailure() << describe_cuts(cuts) << ": raw views do not reassemble the stream";
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// Split-point property tests.

class HttpSseShortStream : public ::testing::TestWithParam<StreamCase> {};
class HttpSseLongStream : public ::testing::TestWithParam<StreamCase> {};

TEST(HttpSse, AFinalDoneWithoutItsEmptyLineIsTheTailOnlyWhenAlone) {
  // (Trailing blanks too, as is_sse_done reads the sentinel everywhere else.)
  for (std::string_view tail :
       {"data: [DONE]\n", "data: [DONE]", "data:[DONE]\r\n", "data: [DONE] \n", "data: [DONE]\t"}) {
    SseReader r;
    const std::string body = std::string("data: {\"a\":1}\n\n") + std::string(tail);
    r.push(body);
    ASSERT_TRUE(r.next());
    EXPECT_FALSE(r.next());
    EXPECT_TRUE(r.tail_is_done()) << tail;
  }
  for (std::string_view tail : {"data: [DONE]x\n", "data: [DO", "event: x\ndata: [DONE]\n", "", "data:  [DONE]\n"}) {
    SseReader r;
    const std::string body = std::string("data: {\"a\":1}\n\n") + std::string(tail);
    r.push(body);
    ASSERT_TRUE(r.next());
    EXPECT_FALSE(r.next());
    EXPECT_FALSE(r.tail_is_done()) << tail;
  }
}

TEST_P(HttpSseShortStream, WholeStreamMatchesReference) { EXPECT_TRUE(same_as_reference(GetParam(), {})); }

TEST_P(HttpSseShortStream, EverySplitPointMatchesReference) {
  const StreamCase& sc = GetParam();
  for (std::size_t a = 0; a <= sc.text.size(); ++a) ASSERT_TRUE(same_as_reference(sc, {a}));
}

TEST_P(HttpSseShortStream, EveryPairOfSplitPointsMatchesReference) {
  const StreamCase& sc = GetParam();
  for (std::size_t a = 0; a <= sc.text.size(); ++a) {
    for (std::size_t b = a; b <= sc.text.size(); ++b) ASSERT_TRUE(same_as_reference(sc, {a, b}));
  }
}

TEST_P(HttpSseShortStream, OneBytePushesMatchReference) {
  const StreamCase& sc = GetParam();
  std::vector<std::size_t> cuts;
  for (std::size_t i = 1; i < sc.text.size(); ++i) cuts.push_back(i);
  EXPECT_TRUE(same_as_reference(sc, cuts));
}

TEST_P(HttpSseLongStream, WholeStreamMatchesReference) { EXPECT_TRUE(same_as_reference(GetParam(), {})); }

TEST_P(HttpSseLongStream, EverySplitPointMatchesReference) {
  const StreamCase& sc = GetParam();
  for (std::size_t a = 0; a <= sc.text.size(); ++a) ASSERT_TRUE(same_as_reference(sc, {a}));
}

TEST_P(HttpSseLongStream, OneBytePushesMatchReference) {
  const StreamCase& sc = GetParam();
  std::vector<std::size_t> cuts;
  for (std::size_t i = 1; i < sc.text.size(); ++i) cuts.push_back(i);
  EXPECT_TRUE(same_as_reference(sc, cuts));
}

TEST_P(HttpSseLongStream, RandomMultiSplitsMatchReference) {
  const StreamCase& sc = GetParam();
  std::mt19937_64 rng(20240611);
  for (int round = 0; round < 2000; ++round) {
    std::uniform_int_distribution<std::size_t> how_many(2, round % 10 == 0 ? 400 : 40);
    std::uniform_int_distribution<std::size_t> where(0, sc.text.size());
    std::vector<std::size_t> cuts(how_many(rng));
    for (auto& c : cuts) c = where(rng);
    std::sort(cuts.begin(), cuts.end());
    ASSERT_TRUE(same_as_reference(sc, cuts));
  }
}

// Every split of every recorded stream: also the streams written with other
// line endings than they were recorded with.
TEST_P(HttpSseLongStream, EverySplitPointWithCrlfAndCrEndings) {
  const StreamCase& sc = GetParam();
  for (std::string_view eol : {"\r\n"sv, "\r"sv}) {
    std::string text;
    for (char c : sc.text) c == '\n' ? text.append(eol) : text.append(1, c);
    const StreamCase converted{sc.name, text, sc.max_event_bytes};
    for (std::size_t a = 0; a <= text.size(); ++a) ASSERT_TRUE(same_as_reference(converted, {a}));
  }
}

INSTANTIATE_TEST_SUITE_P(Recorded, HttpSseShortStream, ::testing::ValuesIn(short_streams()),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Recorded, HttpSseLongStream, ::testing::ValuesIn(long_streams()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// The reference itself, and the reader, against hand-written expectations.

TEST(HttpSseReference, AgreesWithHandWrittenEvents) {
  const Outcome o = reference_parse(kCrlf, {}, kNoLimit);
  ASSERT_EQ(o.events.size(), 4u);
  EXPECT_EQ(o.events[0], (Ev{"data: {\"a\":\"é\"}\r\n\r\n", "{\"a\":\"é\"}", "", "", true}));
  EXPECT_EQ(o.events[1], (Ev{": ping\r\n\r\n", "", "", "", false}));
  EXPECT_EQ(o.events[2],
            (Ev{"event: message\r\nid: 7\r\ndata: one\r\ndata: two\r\n\r\n", "one\ntwo", "message", "7", true}));
  EXPECT_EQ(o.events[3], (Ev{"data: [DONE]\r\n\r\n", "[DONE]", "", "", true}));
  EXPECT_EQ(o.pending, 0u);
}

TEST(HttpSseReader, LimitCasesDoWhatTheySay) {
  EXPECT_FALSE(run_reader(kVllmChat, {}, 264).overflow);
  const Outcome over = run_reader(kVllmChat, {}, 262);
  EXPECT_TRUE(over.overflow);
  EXPECT_EQ(over.events.size(), 5u);
}

TEST(HttpSseReader, ParsesVllmStream) {
  const Outcome o = run_reader(kVllmChat, {}, kNoLimit);
  ASSERT_EQ(o.events.size(), 9u);
  for (const Ev& e : o.events) EXPECT_TRUE(e.has_data);
  EXPECT_NE(o.events[0].data.find(R"("role":"assistant")"), std::string::npos);
  EXPECT_NE(o.events[2].data.find("\"é in\""), std::string::npos);
  EXPECT_NE(o.events[3].data.find("\" 日本\""), std::string::npos);
  EXPECT_NE(o.events[4].data.find("\" 😀\""), std::string::npos);
  EXPECT_NE(o.events[5].data.find(R"(" \"quoted\" back\\slash\n")"), std::string::npos);
  EXPECT_NE(o.events[7].data.find(R"("choices":[],"usage":{)"), std::string::npos);
  EXPECT_EQ(o.events[8].data, "[DONE]");
  EXPECT_EQ(o.events[8].raw, "data: [DONE]\n\n");
  EXPECT_EQ(o.pending, 0u);
}

TEST(HttpSseReader, FieldCorners) {
  const Outcome o = run_reader(kFields, {}, kNoLimit);
  ASSERT_EQ(o.events.size(), 16u);
  const auto& e = o.events;
  EXPECT_EQ(e[0], (Ev{": ping\n\n", "", "", "", false}));
  EXPECT_EQ(e[1], (Ev{":\n\n", "", "", "", false}));
  EXPECT_EQ(e[2].data, "nospace");
  EXPECT_EQ(e[3].data, " two spaces");
  EXPECT_TRUE(e[4].has_data);
  EXPECT_EQ(e[4].data, "");
  EXPECT_TRUE(e[5].has_data);
  EXPECT_EQ(e[5].data, "");
  EXPECT_EQ(e[6].data, "line1\n\nline3");
  EXPECT_EQ(e[7], (Ev{"event: custom\nid: 42\nretry: 3000\ndata: payload\n\n", "payload", "custom", "42", true}));
  EXPECT_EQ(e[8].type, "second");
  EXPECT_EQ(e[8].id, "b");
  EXPECT_EQ(e[9].id, "");
  EXPECT_EQ(e[9].data, "nul");
  EXPECT_EQ(e[10].data, "kept");
  EXPECT_EQ(e[11], (Ev{"event: no-data\n\n", "", "no-data", "", false}));
  EXPECT_EQ(e[12].type, "");
  EXPECT_EQ(e[12].id, "");
  EXPECT_EQ(e[12].data, "empty event and id");
  EXPECT_EQ(e[13].data, "colon: inside: value");
  EXPECT_EQ(e[14], (Ev{"\n", "", "", "", false}));
  EXPECT_EQ(e[15], (Ev{"\n", "", "", "", false}));
  EXPECT_EQ(o.pending, std::string_view("data: tail-incomplete").size());
}

TEST(HttpSseReader, CrOnlyAndMixedEndings) {
  const Outcome cr = run_reader(kCrOnly, {}, kNoLimit);
  ASSERT_EQ(cr.events.size(), 5u);
  EXPECT_EQ(cr.events[0], (Ev{"data: first\r\r", "first", "", "", true}));
  EXPECT_EQ(cr.events[2], (Ev{"event: update\rdata: x\rdata: y\rid: 9\r\r", "x\ny", "update", "9", true}));
  EXPECT_EQ(cr.events[3].data, "日本");

  const Outcome mixed = run_reader(kMixed, {}, kNoLimit);
  ASSERT_EQ(mixed.events.size(), 6u);
  EXPECT_EQ(mixed.events[0].raw, "data: a\r\n\n");
  EXPECT_EQ(mixed.events[1].raw, "data: b\n\r");
  EXPECT_EQ(mixed.events[2].raw, "data: c\r\r\n");
  EXPECT_EQ(mixed.events[3], (Ev{"data: d\ndata: e\r\n\r\n", "d\ne", "", "", true}));
  EXPECT_EQ(mixed.events[4], (Ev{"\n", "", "", "", false}));
  EXPECT_EQ(mixed.events[5].raw, "data: f\r\n\r\n");
}

TEST(HttpSseReader, CrLfOfTheClosingLineSplitAcrossPushes) {
  // The event comes back as soon as its closing CR arrives; the LF that
  // completes that CRLF opens the next event's raw, and is not an empty line.
  SseReader r;
  std::string a = "data: x\r\n\r";
  r.push(a);
  auto ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "data: x\r\n\r");
  EXPECT_EQ(ev->data, "x");
  EXPECT_FALSE(ev->lf_carried);
  EXPECT_FALSE(r.next());
  EXPECT_TRUE(r.awaiting_lf());
  std::string b = "\ndata: y\r\n\r\n";
  r.push(b);
  ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "\ndata: y\r\n\r\n");
  EXPECT_EQ(ev->data, "y");
  EXPECT_TRUE(ev->lf_carried);
  EXPECT_FALSE(r.next());
  EXPECT_FALSE(r.awaiting_lf());
  EXPECT_EQ(r.pending_bytes(), 0u);

  // The carried LF alone in a push, its event completed by later pushes: still flagged, once.
  r.reset();
  r.push(a);
  while (r.next()) {
  }
  std::string lone_lf = "\n", rest = "data: z\n\n", more = "\ndata: w\n\n";
  r.push(lone_lf);
  EXPECT_FALSE(r.next());
  r.push(rest);
  ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "\ndata: z\n\n");
  EXPECT_TRUE(ev->lf_carried);
  EXPECT_FALSE(r.next());
  r.push(more);  // a stray empty line, then an event: neither carries an LF
  ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "\n");
  EXPECT_FALSE(ev->lf_carried);
  ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_FALSE(ev->lf_carried);
  EXPECT_FALSE(r.awaiting_lf());
  // A last `data: [DONE]` without its empty line, behind the carried LF: the tail is the sentinel still.
  r.reset();
  r.push(a);
  while (r.next()) {
  }
  std::string done_tail = "\ndata: [DONE]\r\n";
  r.push(done_tail);
  EXPECT_FALSE(r.next());
  EXPECT_TRUE(r.tail_lf_carried());
  EXPECT_TRUE(r.tail_is_done());
  // A CR-only stream's event ending a push awaits an LF that never comes: the next event is not flagged.
  r.reset();
  std::string cr = "data: a\r\r", cr2 = "data: b\r\r";
  r.push(cr);
  ASSERT_TRUE(r.next());
  EXPECT_FALSE(r.next());
  EXPECT_TRUE(r.awaiting_lf());
  r.push(cr2);
  ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "data: b\r\r");
  EXPECT_FALSE(ev->lf_carried);
  r.reset();

  // If the stream ends there, the held LF is not an incomplete event.
  r.push(a);
  while (r.next()) {
  }
  std::string lf = "\n";
  r.push(lf);
  EXPECT_FALSE(r.next());
  EXPECT_EQ(r.pending_bytes(), 1u);
  EXPECT_EQ(r.finish(), 0u);
}

TEST(HttpSseReader, CrEndingANonEmptyLineThenLfInNextPush) {
  SseReader r;
  std::string a = "data: x\r";
  std::string b = "\n\r\n";
  r.push(a);
  EXPECT_FALSE(r.next());
  r.push(b);
  auto ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "data: x\r\n\r\n");
  EXPECT_FALSE(r.next());
}

TEST(HttpSseReader, WholeEventsAreViewsIntoThePushedBuffer) {
  SseReader r;
  const std::string buf = std::string(kVllmChat);
  r.push(buf);
  std::size_t n = 0;
  while (auto ev = r.next()) {
    ++n;
    EXPECT_GE(ev->raw.data(), buf.data());
    EXPECT_LE(ev->raw.data() + ev->raw.size(), buf.data() + buf.size());
    EXPECT_GE(ev->data.data(), ev->raw.data());  // single data line: a view into raw, no copy
    EXPECT_LE(ev->data.data() + ev->data.size(), ev->raw.data() + ev->raw.size());
  }
  EXPECT_EQ(n, 9u);
}

TEST(HttpSseReader, SplitEventIsCopiedOnceAndLaterOnesAreViews) {
  SseReader r;
  std::string a = "data: hel";
  std::string b = "lo\n\ndata: whole\n\n";
  r.push(a);
  EXPECT_FALSE(r.next());
  EXPECT_EQ(r.pending_bytes(), a.size());
  r.push(b);
  auto first = r.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->data, "hello");
  EXPECT_FALSE(first->raw.data() >= b.data() && first->raw.data() < b.data() + b.size());
  auto second = r.next();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->data, "whole");
  EXPECT_EQ(second->raw.data(), b.data() + 4);
}

TEST(HttpSseReader, Utf8SplitInsideASequence) {
  const std::string text = "data: 😀日é\n\n";
  for (std::size_t cut = 1; cut < text.size(); ++cut) {
    SseReader r;
    std::string a = text.substr(0, cut);
    std::string b = text.substr(cut);
    r.push(a);
    EXPECT_FALSE(r.next());
    r.push(b);
    auto ev = r.next();
    ASSERT_TRUE(ev) << cut;
    EXPECT_EQ(ev->data, "😀日é") << cut;
  }
}

TEST(HttpSseReader, BomIsSkippedOnlyAtTheStart) {
  for (std::size_t cut = 0; cut <= 5; ++cut) {
    SseReader r;
    std::string text = std::string(kBom) + "data: x\n\n" + std::string(kBom) + "data: y\n\n";
    std::string a = text.substr(0, cut);
    std::string b = text.substr(cut);
    r.push(a);
    std::vector<Ev> evs;
    while (auto ev = r.next()) evs.push_back({std::string(ev->raw), std::string(ev->data), "", "", ev->has_data});
    r.push(b);
    while (auto ev = r.next()) evs.push_back({std::string(ev->raw), std::string(ev->data), "", "", ev->has_data});
    ASSERT_EQ(evs.size(), 2u) << cut;
    EXPECT_EQ(evs[0], (Ev{"data: x\n\n", "x", "", "", true})) << cut;
    EXPECT_FALSE(evs[1].has_data) << cut;  // "\xEF\xBB\xBFdata" is an unknown field name
  }
  SseReader r;
  std::string partial = "\xEF\xBB";
  r.push(partial);
  EXPECT_FALSE(r.next());
  EXPECT_EQ(r.pending_bytes(), 2u);
  EXPECT_EQ(r.finish(), 2u);
}

TEST(HttpSseReader, OversizedEventIsAnErrorUntilReset) {
  SseReader r(16);
  std::string ok = "data: 123456789\n\n";   // 17 bytes
  std::string fits = "data: 12345678\n\n";  // 16 bytes
  r.push(fits);
  ASSERT_TRUE(r.next());
  EXPECT_FALSE(r.next());
  r.push(ok);
  EXPECT_FALSE(r.next());
  EXPECT_TRUE(r.error());
  r.push(fits);
  EXPECT_FALSE(r.next());  // stays failed
  r.reset();
  EXPECT_FALSE(r.error());
  r.push(fits);
  EXPECT_TRUE(r.next());
}

TEST(HttpSseReader, IncompleteOversizedEventFailsBeforeItsEnd) {
  SseReader r(16);
  std::string a = "data: 0123456789";  // 16 bytes, no line break yet: held
  std::string b = "X";
  r.push(a);
  EXPECT_FALSE(r.next());
  EXPECT_FALSE(r.error());
  EXPECT_EQ(r.pending_bytes(), 16u);
  r.push(b);
  EXPECT_FALSE(r.next());
  EXPECT_TRUE(r.error());
  EXPECT_EQ(r.pending_bytes(), 0u);  // nothing is held after the error
}

TEST(HttpSseReader, FinishAndReset) {
  SseReader r;
  std::string a = "data: done\n\ndata: partial";
  r.push(a);
  ASSERT_TRUE(r.next());
  EXPECT_FALSE(r.next());
  EXPECT_EQ(r.pending_bytes(), 13u);
  EXPECT_EQ(r.finish(), 13u);
  EXPECT_EQ(r.pending_bytes(), 0u);
  // finish() resets: a BOM is skipped again on the next stream.
  std::string b = std::string(kBom) + "data: again\n\n";
  r.push(b);
  auto ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "data: again\n\n");
  EXPECT_EQ(r.finish(), 0u);
}

TEST(HttpSseReader, EmptyPushesChangeNothing) {
  SseReader r;
  EXPECT_FALSE(r.next());
  r.push({});
  EXPECT_FALSE(r.next());
  std::string a = "data: x\r";
  r.push(a);
  EXPECT_FALSE(r.next());
  r.push({});
  EXPECT_FALSE(r.next());
  std::string b = "\n\n";
  r.push(b);
  auto ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->raw, "data: x\r\n\n");
}

TEST(HttpSseEvent, IsDone) {
  SseEvent e;
  e.data = "[DONE]";
  EXPECT_FALSE(e.is_done());
  e.has_data = true;
  EXPECT_TRUE(e.is_done());
  // Trailing spaces or tabs are tolerated (the openai SDKs end on data that starts with "[DONE]");
  // anything else after it, or before it, is not the sentinel.
  for (const char* d : {"[DONE] ", "[DONE]\t", "[DONE]  \t "}) {
    e.data = d;
    EXPECT_TRUE(e.is_done()) << d;
  }
  for (const char* d : {"[DONE]x", " [DONE]", "[DONE", "[done]", "[DONE]\n"}) {
    e.data = d;
    EXPECT_FALSE(e.is_done()) << d;
  }
}

// ---------------------------------------------------------------------------
// append_sse_data

TEST(HttpAppendSseData, Shapes) {
  std::string out = "prefix|";
  append_sse_data(out, R"({"a":1})");
  EXPECT_EQ(out, "prefix|data: {\"a\":1}\n\n");
  out.clear();
  append_sse_data(out, "");
  EXPECT_EQ(out, "data: \n\n");
  out.clear();
  append_sse_data(out, "a\nb");
  EXPECT_EQ(out, "data: a\ndata: b\n\n");
  out.clear();
  append_sse_data(out, "a\n");
  EXPECT_EQ(out, "data: a\ndata: \n\n");
  out.clear();
  append_sse_data(out, "a\rb\r\nc\n\rd");
  EXPECT_EQ(out, "data: a\ndata: b\ndata: c\ndata: \ndata: d\n\n");
}

TEST(HttpAppendSseData, RoundTripsThroughTheReader) {
  const std::vector<std::string> payloads = {
      "",
      "x",
      "[DONE]",
      "a\nb",
      "\n",
      "\n\n",
      "a\n\nb",
      " lead",
      ": not a comment",
      "data: nested",
      std::string(kVllmShort.substr(6, 80)),
      "é日😀",
      "tail\n",
  };
  for (const std::string& p : payloads) {
    std::string wire;
    append_sse_data(wire, p);
    SseReader r;
    r.push(wire);
    auto ev = r.next();
    ASSERT_TRUE(ev) << p;
    EXPECT_TRUE(ev->has_data);
    EXPECT_EQ(ev->data, p);
    EXPECT_EQ(ev->raw, wire);
    EXPECT_FALSE(r.next());
  }
  std::string wire;
  append_sse_data(wire, "a\r\nb\rc");
  SseReader r;
  r.push(wire);
  auto ev = r.next();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->data, "a\nb\nc");  // CR and CRLF come back as LF
}

// ---------------------------------------------------------------------------
// Steady state: no heap allocation per event (DESIGN.md, Memory).

// Feeds `pieces` through `r` `rounds` times and returns the events seen.
std::size_t drive(SseReader& r, const std::vector<std::string>& pieces, int rounds) {
  std::size_t events = 0;
  for (int i = 0; i < rounds; ++i) {
    for (const std::string& p : pieces) {
      r.push(p);
      while (auto ev = r.next()) events += ev->has_data ? 1 : 0;
    }
  }
  return events;
}

std::vector<std::string> cut_every(std::string_view text, std::size_t step) {
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < text.size(); i += step) pieces.emplace_back(text.substr(i, step));
  return pieces;
}

TEST(HttpSseReaderAllocations, NoneInSteadyState) {
  if (!weir::test::AllocationScope::available()) {
    GTEST_SKIP() << "operator new is not the counting one in this build (sanitizer or another replacement)";
  }
  std::string multi_line = "event: x\ndata: a\ndata: b\ndata: c\n\n";
  std::string stream = std::string(kVllmChat) + multi_line + std::string(kCrlf) + std::string(kCrOnly);
  struct Shape {
    const char* name;
    std::vector<std::string> pieces;
  };
  std::vector<Shape> shapes;
  shapes.push_back({"whole stream", {stream}});
  std::vector<std::string> per_event;
  for (std::size_t pos = 0; pos < kVllmChat.size();) {
    const std::size_t end = kVllmChat.find("\n\n", pos) + 2;
    per_event.emplace_back(kVllmChat.substr(pos, end - pos));
    pos = end;
  }
  shapes.push_back({"one push per event", per_event});
  shapes.push_back({"1-byte pushes", cut_every(stream, 1)});
  shapes.push_back({"7-byte pushes", cut_every(stream, 7)});
  shapes.push_back({"100-byte pushes", cut_every(stream, 100)});
  for (const Shape& s : shapes) {
    SseReader r;
    const std::size_t warm = drive(r, s.pieces, 2);  // buffers reach their working size
    std::size_t allocations = 0;
    std::size_t events = 0;
    {
      const weir::test::AllocationScope scope;
      events = drive(r, s.pieces, 20);
      allocations = scope.count();
    }
    EXPECT_EQ(events, warm * 10) << s.name;
    EXPECT_EQ(allocations, 0u) << s.name << ": " << allocations << " allocations over " << events << " events";
  }
}

// An upstream's ill-formed UTF-8 reached the client byte for byte (the openai SDK raised UnicodeDecodeError
// mid-stream). replace_invalid_utf8 gives each maximal ill-formed subsequence of raw and data one U+FFFD
// (Python's errors="replace"); a well-formed event, a character split across pushes among them, is left
// as the reader gave it: the same views, no copy.
TEST(HttpSseUtf8, IllFormedBytesBecomeReplacementsInRawAndData) {
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string in, raw, data;
    std::size_t replaced;
  };
  const Case cases[] = {
      {"data: {\"c\":\"a\xFF"
       "b\"}\n\n",
       "data: {\"c\":\"a" + fffd + "b\"}\n\n", "{\"c\":\"a" + fffd + "b\"}", 1},
      {"data: \xC0\x80\n\n", "data: " + fffd + fffd + "\n\n", fffd + fffd, 2},                    // overlong
      {"data: \xED\xA0\x80\n\n", "data: " + fffd + fffd + fffd + "\n\n", fffd + fffd + fffd, 3},  // surrogate
      {"data: \xF4\x90\x80\x80\n\n", "data: " + fffd + fffd + fffd + fffd + "\n\n", fffd + fffd + fffd + fffd, 4},
      // Cut short at the line's end, and across the lines of multi-line data (joined by '\n': two subparts).
      {"data: x\xE2\x82\r\ndata: \xBFy\r\n\r\n", "data: x" + fffd + "\r\ndata: " + fffd + "y\r\n\r\n",
       "x" + fffd + "\n" + fffd + "y", 2},
      // Only a comment or an id is ill-formed: raw is repaired, data stays.
      {": \xFF\ndata: ok\n\n", ": " + fffd + "\ndata: ok\n\n", "ok", 1},
  };
  for (const auto& c : cases) {
    SseReader r;
    r.push(c.in);
    auto ev = r.next();
    ASSERT_TRUE(ev) << c.in;
    Utf8Repair repair;
    EXPECT_EQ(replace_invalid_utf8(*ev, repair), c.replaced) << c.in;
    EXPECT_EQ(ev->raw, c.raw);
    EXPECT_EQ(ev->data, c.data);
    EXPECT_TRUE(ev->has_data);
    // Once repaired it is well-formed: a second pass changes nothing.
    const std::string_view raw = ev->raw;
    EXPECT_EQ(replace_invalid_utf8(*ev, repair), 0u);
    EXPECT_EQ(ev->raw.data(), raw.data());
  }
}

TEST(HttpSseUtf8, WellFormedEventsAndCharactersSplitAcrossPushesAreUntouched) {
  const std::string text = "data: {\"c\":\"\xF0\x9F\x98\x80\xE6\x97\xA5\xC3\xA9\"}\n\n";
  for (std::size_t cut = 1; cut < text.size(); ++cut) {
    SseReader r;
    const std::string a = text.substr(0, cut), b = text.substr(cut);
    r.push(a);
    ASSERT_FALSE(r.next());
    r.push(b);
    auto ev = r.next();
    ASSERT_TRUE(ev) << cut;
    const SseEvent before = *ev;
    Utf8Repair repair;
    EXPECT_EQ(replace_invalid_utf8(*ev, repair), 0u) << cut;
    EXPECT_EQ(ev->raw.data(), before.raw.data());
    EXPECT_EQ(ev->data.data(), before.data.data());
    EXPECT_EQ(ev->raw, text);
    EXPECT_TRUE(repair.raw.empty());
  }
}

TEST(HttpSseUtf8, NoAllocationForWellFormedEventsAndNoneOnceTheBuffersGrew) {
  if (!weir::test::AllocationScope::available()) {
    GTEST_SKIP() << "operator new is not the counting one in this build (sanitizer or another replacement)";
  }
  const std::string good(kVllmChat), bad = "data: {\"c\":\"\xFF\xC0\x80\"}\n\n";
  SseReader r;
  Utf8Repair repair;
  auto run = [&](const std::string& text) {
    std::size_t replaced = 0;
    r.push(text);
    while (auto ev = r.next()) replaced += replace_invalid_utf8(*ev, repair);
    return replaced;
  };
  EXPECT_EQ(run(bad), 3u);  // the repair's buffers reach their size
  std::size_t allocations = 0, good_replaced = 0, bad_replaced = 0;
  {
    const weir::test::AllocationScope scope;
    good_replaced = run(good);
    bad_replaced = run(bad);
    allocations = scope.count();
  }
  EXPECT_EQ(good_replaced, 0u);
  EXPECT_EQ(bad_replaced, 3u);
  EXPECT_EQ(allocations, 0u);
}

}  // namespace
}  // namespace weir::http
