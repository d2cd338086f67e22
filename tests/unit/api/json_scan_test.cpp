// find_member / set_member / remove_member: a table of hand-written cases, and
// a property test over random objects whose member offsets the generator
// records as it writes them (the oracle for spans and for byte-exactness),
// with Boost.JSON as the oracle for meaning.
#include "api/json_scan.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace weir::api {
namespace {

namespace json = boost::json;
using namespace std::string_view_literals;

std::string_view value_at(std::string_view text, const MemberSpan& s) {
  return text.substr(s.value_begin, s.value_end - s.value_begin);
}

// ---------------------------------------------------------------------------
// find_member: table.

struct FindCase {
  std::string_view name;
  std::string_view json;
  std::string_view key;
  std::optional<std::string_view> value;  // the value's text, or nullopt if not found
};

class ApiFindMember : public ::testing::TestWithParam<FindCase> {};

TEST_P(ApiFindMember, Table) {
  const FindCase& c = GetParam();
  const auto span = find_member(c.json, c.key);
  if (!c.value) {
    EXPECT_FALSE(span) << c.json;
    return;
  }
  ASSERT_TRUE(span) << c.json;
  EXPECT_EQ(value_at(c.json, *span), *c.value);
  EXPECT_EQ(c.json[span->key_begin], '"');
  EXPECT_LT(span->key_begin, span->value_begin);
}

const FindCase kFindCases[] = {
    {"first", R"({"model":"llama","stream":true})", "model", R"("llama")"},
    {"last", R"({"stream":true,"model":"llama"})", "model", R"("llama")"},
    {"absent", R"({"stream":true})", "model", std::nullopt},
    {"empty_object", "{}", "model", std::nullopt},
    {"empty_object_spaces", " \n{ \t}\r\n", "model", std::nullopt},
    {"whitespace_everywhere", "\n {\n\t\"model\" \r\n:\t \"x\" ,\n \"b\" : [ 1 , 2 ] \n}\n ", "model", R"("x")"},
    {"number", R"({"n":-1.5e+10})", "n", "-1.5e+10"},
    {"number_before_brace", R"({"n":42})", "n", "42"},
    {"number_before_ws", "{\"n\":42 }", "n", "42"},
    {"literals", R"({"t":true,"f":false,"z":null})", "f", "false"},
    {"null_value", R"({"z":null})", "z", "null"},
    {"nested_object", R"({"o":{"model":"inner","x":[1,{"y":"}"}]},"model":"outer"})", "model", R"("outer")"},
    {"nested_only", R"({"o":{"model":"inner"}})", "model", std::nullopt},
    {"object_value", R"({"o":{"a":[1,2,{"b":"]}"}]} ,"z":1})", "o", R"({"a":[1,2,{"b":"]}"}]})"},
    {"array_value", R"({"a":["}",{"b":"]"},[],[[]]],"model":1})", "a", R"(["}",{"b":"]"},[],[[]]])"},
    {"escaped_quote_in_value", R"({"a":"x\"y","model":"m"})", "model", R"("m")"},
    {"escaped_quote_value", R"({"a":"x\"y"})", "a", R"("x\"y")"},
    {"escaped_backslash_at_end", R"({"a":"x\\","model":"m"})", "model", R"("m")"},
    {"backslash_runs", R"({"a":"\\\"\\\\\"","model":"m"})", "model", R"("m")"},
    {"only_backslashes", R"({"a":"\\\\\\\\","b":1})", "a", R"("\\\\\\\\")"},
    {"key_like_text_in_string", R"({"a":"\",\"model\":\"fake","model":"real"})", "model", R"("real")"},
    {"unicode_escape_key", R"({"mo\u0064el":"x"})", "model", R"("x")"},
    {"unicode_escape_key_upper", R"({"mo\u0044el":"x"})", "moDel", R"("x")"},
    {"escaped_quote_key", R"({"a\"b":1})", "a\"b", "1"},
    {"escaped_backslash_key", R"({"a\\b":1})", "a\\b", "1"},
    {"escaped_backslash_key_is_not_raw", R"({"a\\b":1})", "a\\\\b", std::nullopt},
    {"solidus_key", R"({"\/":1})", "/", "1"},
    {"control_escape_key", R"({"a\nb\t":1})", "a\nb\t", "1"},
    {"nul_escape_key", R"({"a\u0000b":1})", "a\0b"sv, "1"},
    {"two_byte_escape_key", R"({"caf\u00e9":1})", "café", "1"},
    {"three_byte_escape_key", R"({"\u65e5\u672c":1})", "日本", "1"},
    {"surrogate_pair_key", R"({"\ud83d\ude00":1})", "😀", "1"},
    {"raw_utf8_key", R"({"日本":1})", "日本", "1"},
    {"escape_does_not_match_prefix", R"({"mo\u0064elx":1})", "model", std::nullopt},
    {"key_prefix", R"({"mode":1,"models":2})", "model", std::nullopt},
    {"empty_key", R"({"":1,"a":2})", "", "1"},
    {"duplicate_last_wins", R"({"model":"a","x":1,"model":"b"})", "model", R"("b")"},
    {"duplicate_escaped_last_wins", R"({"model":"a","mo\u0064el":"b"})", "model", R"("b")"},
    {"utf8_values", R"({"a":"é日😀","model":"m"})", "model", R"("m")"},
    {"not_object_array", R"([{"model":1}])", "model", std::nullopt},
    {"not_object_string", R"("model")", "model", std::nullopt},
    {"not_object_number", "1", "model", std::nullopt},
    {"empty_text", "", "model", std::nullopt},
    {"only_ws", " \n", "model", std::nullopt},
    {"unclosed_object", R"({"model":1)", "model", std::nullopt},
    {"unclosed_brace_only", "{", "model", std::nullopt},
    {"missing_value", R"({"model":})", "model", std::nullopt},
    {"missing_colon", R"({"model" 1})", "model", std::nullopt},
    {"trailing_comma", R"({"model":1,})", "model", std::nullopt},
    {"trailing_garbage", R"({"model":1} x)", "model", std::nullopt},
    {"two_objects", R"({"model":1}{})", "model", std::nullopt},
    {"unterminated_string", R"({"model":"abc})", "model", std::nullopt},
    {"unterminated_key", R"({"model)", "model", std::nullopt},
    {"unterminated_array", R"({"model":[1,2})", "model", std::nullopt},
    {"bare_word", R"({"model":abc})", "model", std::nullopt},
    {"unquoted_key", R"({model:1})", "model", std::nullopt},
};

// find_last_member agrees with find_member on every valid text of the table
// (on malformed ones it checks only the members after its match).
TEST_P(ApiFindMember, FromTheEndOnValidJson) {
  const FindCase& c = GetParam();
  boost::system::error_code ec;
  (void)json::parse(c.json, ec);
  if (ec) GTEST_SKIP() << "not JSON";
  const auto forward = find_member(c.json, c.key);
  const auto backward = find_last_member(c.json, c.key);
  ASSERT_EQ(forward.has_value(), backward.has_value()) << c.json;
  if (forward) {
    EXPECT_EQ(backward->key_begin, forward->key_begin) << c.json;
    EXPECT_EQ(backward->value_begin, forward->value_begin) << c.json;
    EXPECT_EQ(backward->value_end, forward->value_end) << c.json;
  }
}

TEST(ApiParseUpstreamJson, ALoneSurrogateEscapeIsReadAsTheReplacementCharacter) {
  // A pair split across two stream chunks leaves a lone half in each: RFC 8259 allows it, Boost.JSON refuses it.
  boost::system::error_code ec;
  auto v = parse_upstream_json(R"({"content":"Hi \ud83d"})", ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(v.at("content"), "Hi \xEF\xBF\xBD");
  v = parse_upstream_json(R"({"c":"\ude00 there \ud83d\ude00 \\ud83d"})", ec);  // lone low, a pair, an escaped '\'
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(v.at("c"), "\xEF\xBF\xBD there \xF0\x9F\x98\x80 \\ud83d");
  parse_upstream_json(R"({"c":"a"})", ec);
  EXPECT_FALSE(ec);
  parse_upstream_json(R"({"c":"\ud83d")", ec);  // another fault stands
  EXPECT_TRUE(ec);
}

TEST(ApiFindLastMember, MalformedEndsAreNotFound) {
  for (std::string_view bad :
       {R"({"usage":{"prompt_tokens":1})", R"([{"usage":1}])", R"({"usage":1}})", R"({"usage":1)", R"("usage":1})", "",
        "}", "{", R"({"usage" 1})", R"({"usage":})", R"(x{"usage":1})"})
    EXPECT_FALSE(find_last_member(bad, "usage")) << bad;
}

INSTANTIATE_TEST_SUITE_P(Cases, ApiFindMember, ::testing::ValuesIn(kFindCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// set_member / remove_member: table.

TEST(ApiSetMember, ReplacesInPlace) {
  std::string out;
  ASSERT_TRUE(set_member(R"({"model":"alias","stream":true})", "model", R"("meta-llama/Llama-3.1-8B")", out));
  EXPECT_EQ(out, R"({"model":"meta-llama/Llama-3.1-8B","stream":true})");
  ASSERT_TRUE(set_member("{ \"a\" : [1, 2] ,\n \"b\":0 }", "a", "null", out));
  EXPECT_EQ(out, "{ \"a\" : null ,\n \"b\":0 }");
}

TEST(ApiSetMember, InsertsFirst) {
  std::string out;
  ASSERT_TRUE(set_member("{}", "k", "1", out));
  EXPECT_EQ(out, R"({"k":1})");
  ASSERT_TRUE(set_member(R"({"a":1})", "k", R"({"include_usage":true})", out));
  EXPECT_EQ(out, R"({"k":{"include_usage":true},"a":1})");
  ASSERT_TRUE(set_member(" { } ", "k", "1", out));
  EXPECT_EQ(out, R"( {"k":1 } )");
  ASSERT_TRUE(set_member("{\n  \"a\": 1\n}", "k", "2", out));
  EXPECT_EQ(out, "{\"k\":2,\n  \"a\": 1\n}");
}

TEST(ApiSetMember, EscapesAnInsertedKey) {
  std::string out;
  ASSERT_TRUE(set_member("{}", "a\"b\\c\n\x01/é", "1", out));
  EXPECT_EQ(out, R"({"a\"b\\c\n\u0001/é":1})");
  EXPECT_EQ(json::parse(out).as_object().at("a\"b\\c\n\x01/é"), 1);
  const auto span = find_member(out, "a\"b\\c\n\x01/é");
  ASSERT_TRUE(span);
  EXPECT_EQ(value_at(out, *span), "1");
}

// Every copy goes: an upstream whose parser keeps the first duplicate (not
// Python's) must not read the client's value instead of the one set.
TEST(ApiSetMember, ReplacesEveryCopyOfADuplicate) {
  std::string out;
  ASSERT_TRUE(set_member(R"({"model":"a","model":"b"})", "model", R"("c")", out));
  EXPECT_EQ(out, R"({"model":"c"})");
  ASSERT_TRUE(set_member(R"({"model":"a","x":1,"mo\u0064el":"b","y":2})", "model", R"("c")", out));
  EXPECT_EQ(out, R"({"model":"c","x":1,"y":2})");
  EXPECT_EQ(json::parse(out).as_object().at("model"), "c");
}

TEST(ApiSetMember, MatchesAnEscapedKey) {
  std::string out;
  ASSERT_TRUE(set_member(R"({"mo\u0064el":"a"})", "model", R"("b")", out));
  EXPECT_EQ(out, R"({"mo\u0064el":"b"})");
}

TEST(ApiSetMember, RejectsNonObjectsAndLeavesOutAlone) {
  for (std::string_view bad : {"[]"sv, ""sv, "{"sv, R"({"a":1,})"sv, "null"sv, R"({"a":"x)"sv}) {
    std::string out = "untouched";
    EXPECT_FALSE(set_member(bad, "a", "1", out)) << bad;
    EXPECT_EQ(out, "untouched");
    EXPECT_FALSE(remove_member(bad, "a", out)) << bad;
    EXPECT_EQ(out, "untouched");
  }
}

TEST(ApiSetMember, OverwritesOut) {
  std::string out = "previous contents";
  ASSERT_TRUE(set_member("{}", "a", "1", out));
  EXPECT_EQ(out, R"({"a":1})");
}

struct RemoveCase {
  std::string_view name;
  std::string_view json;
  std::string_view key;
  std::string_view want;
};

class ApiRemoveMember : public ::testing::TestWithParam<RemoveCase> {};

TEST_P(ApiRemoveMember, Table) {
  const RemoveCase& c = GetParam();
  std::string out = "garbage";
  ASSERT_TRUE(remove_member(c.json, c.key, out));
  EXPECT_EQ(out, c.want);
  EXPECT_NO_THROW(json::parse(out)) << out;
}

const RemoveCase kRemoveCases[] = {
    {"absent", R"({"a":1})", "b", R"({"a":1})"},
    {"empty", "{ }", "b", "{ }"},
    {"only", R"({"a":1})", "a", "{}"},
    {"first", R"({"a":1,"b":2,"c":3})", "a", R"({"b":2,"c":3})"},
    {"middle", R"({"a":1,"b":2,"c":3})", "b", R"({"a":1,"c":3})"},
    {"last", R"({"a":1,"b":2,"c":3})", "c", R"({"a":1,"b":2})"},
    {"pretty_first", "{\n  \"a\": 1,\n  \"b\": 2\n}", "a", "{\n  \"b\": 2\n}"},
    {"pretty_last", "{\n  \"a\": 1,\n  \"b\": 2\n}", "b", "{\n  \"a\": 1\n}"},
    {"pretty_only", "{\n  \"a\": 1\n}", "a", "{\n  \n}"},
    {"spaced_middle", "{ \"a\" : 1 , \"b\" : 2 , \"c\" : 3 }", "b", "{ \"a\" : 1 , \"c\" : 3 }"},
    {"duplicates_all_go", R"({"a":1,"b":2,"a":3,"c":4,"a":5})", "a", R"({"b":2,"c":4})"},
    {"escaped_duplicate", R"({"a":1,"\u0061":2,"b":3})", "a", R"({"b":3})"},
    {"nested_untouched", R"({"o":{"a":1},"a":2})", "a", R"({"o":{"a":1}})"},
    {"stream_options", R"({"model":"m","stream_options":{"include_usage":true},"stream":true})", "stream_options",
     R"({"model":"m","stream":true})"},
};

INSTANTIATE_TEST_SUITE_P(Cases, ApiRemoveMember, ::testing::ValuesIn(kRemoveCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// Property test: random objects.

// Code points the generator draws from: JSON's specials, control characters,
// the bracket and separator bytes the scanner looks for, and 2-, 3- and 4-byte
// UTF-8.
constexpr char32_t kCodePoints[] = {U'a',  U'b',  U'z',  U'M',  U'0',   U' ',   U'"',    U'\\', U'/', U'\n',
                                    U'\t', U'\r', U'\b', U'\f', 0x01,   0x1F,   U':',    U',',  U'{', U'}',
                                    U'[',  U']',  0x7F,  0xE9,  0x65E5, 0x672C, 0x1F600, 0xFFFD};

std::string to_utf8(std::u32string_view cps) {
  std::string s;
  for (char32_t cp : cps) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

struct GenMember {
  std::string key;  // decoded (UTF-8)
  std::size_t key_begin;
  std::size_t value_begin;
  std::size_t value_end;
};

struct GenObject {
  std::string text;
  std::size_t open;  // the '{'
  std::vector<GenMember> members;
};

class JsonGen {
 public:
  explicit JsonGen(std::uint64_t seed) : rng_(seed) {}

  bool chance(int percent) { return std::uniform_int_distribution<int>(0, 99)(rng_) < percent; }
  std::size_t below(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  std::string ws() {
    std::string s;
    if (chance(60)) return s;
    const std::size_t n = 1 + below(3);
    for (std::size_t i = 0; i < n; ++i) s += " \t\n\r"[below(4)];
    return s;
  }

  std::u32string code_points(std::size_t max_len) {
    std::u32string s;
    const std::size_t n = below(max_len + 1);
    for (std::size_t i = 0; i < n; ++i) s += kCodePoints[below(std::size(kCodePoints))];
    return s;
  }

  // A JSON string literal for `cps`, each code point written in one of the
  // ways JSON allows, picked at random.
  std::string encode(std::u32string_view cps) {
    static constexpr char kHex[] = "0123456789abcdef0123456789ABCDEF";
    const auto u4 = [&](std::string& s, unsigned v) {
      const int upper = chance(50) ? 16 : 0;
      s += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) s += kHex[((v >> shift) & 0xF) + upper];
    };
    std::string s = "\"";
    for (char32_t cp : cps) {
      const bool escape = chance(25);
      switch (cp) {
        case U'"':
          escape ? u4(s, cp) : void(s += "\\\"");
          continue;
        case U'\\':
          escape ? u4(s, cp) : void(s += "\\\\");
          continue;
        case U'/':
          escape ? void(s += "\\/") : void(s += "/");
          continue;
        case U'\n':
          escape ? u4(s, cp) : void(s += "\\n");
          continue;
        case U'\t':
          escape ? u4(s, cp) : void(s += "\\t");
          continue;
        case U'\r':
          escape ? u4(s, cp) : void(s += "\\r");
          continue;
        case U'\b':
          escape ? u4(s, cp) : void(s += "\\b");
          continue;
        case U'\f':
          escape ? u4(s, cp) : void(s += "\\f");
          continue;
        default:
          break;
      }
      if (cp < 0x20) {
        u4(s, cp);
      } else if (!escape) {
        s += to_utf8(std::u32string_view(&cp, 1));
      } else if (cp < 0x10000) {
        u4(s, cp);
      } else {
        const char32_t v = cp - 0x10000;
        u4(s, 0xD800 + (v >> 10));
        u4(s, 0xDC00 + (v & 0x3FF));
      }
    }
    return s + "\"";
  }

  std::string number() {
    static constexpr std::string_view kNumbers[] = {
        "0", "-0", "7", "-1", "123456789012", "3.14", "-0.5e-3", "1E+10", "2e5", "18446744073709551615", "1.0"};
    return std::string(kNumbers[below(std::size(kNumbers))]);
  }

  std::string value(int depth) {
    const std::size_t kind = below(depth > 0 ? 8 : 6);
    switch (kind) {
      case 0:
      case 1:
        return encode(code_points(12));
      case 2:
      case 3:
        return number();
      case 4:
        return chance(50) ? "true" : "false";
      case 5:
        return "null";
      case 6: {
        std::string s = "[" + ws();
        const std::size_t n = below(4);
        for (std::size_t i = 0; i < n; ++i) s += (i ? "," + ws() : "") + value(depth - 1) + ws();
        return s + "]";
      }
      default: {
        std::string s = "{" + ws();
        const std::size_t n = below(4);
        for (std::size_t i = 0; i < n; ++i) {
          s += (i ? "," + ws() : "") + encode(code_points(6)) + ws() + ":" + ws() + value(depth - 1) + ws();
        }
        return s + "}";
      }
    }
  }

  // Keys that collide often: duplicates and differently escaped spellings
  // of the same name are common.
  std::u32string key() {
    static const std::u32string kPool[] = {U"model",       U"stream", U"messages", U"a",      U"",     U"k\"q",
                                           U"back\\slash", U"日本",   U"😀",        U"mo/del", U"x:y,{"};
    return chance(80) ? kPool[below(std::size(kPool))] : code_points(5);
  }

  GenObject object() {
    GenObject o;
    o.text = ws();
    o.open = o.text.size();
    o.text += "{" + ws();
    const std::size_t n = below(7);
    for (std::size_t i = 0; i < n; ++i) {
      if (i) o.text += "," + ws();
      const std::u32string k = key();
      GenMember m;
      m.key = to_utf8(k);
      m.key_begin = o.text.size();
      o.text += encode(k) + ws() + ":" + ws();
      m.value_begin = o.text.size();
      o.text += value(3);
      m.value_end = o.text.size();
      o.text += ws();
      o.members.push_back(m);
    }
    o.text += "}" + ws();
    return o;
  }

 private:
  std::mt19937_64 rng_;
};

// The meaning of a generated object, built member by member (last one wins).
json::object meaning(const GenObject& o) {
  json::object obj;
  for (const GenMember& m : o.members) {
    obj[m.key] = json::parse(o.text.substr(m.value_begin, m.value_end - m.value_begin));
  }
  return obj;
}

const GenMember* last_with_key(const GenObject& o, std::string_view key) {
  const GenMember* found = nullptr;
  for (const GenMember& m : o.members) {
    if (m.key == key) found = &m;
  }
  return found;
}

std::vector<std::string> probe_keys(JsonGen& gen, const GenObject& o) {
  std::vector<std::string> keys = {"model", "stream_options", "", "k\"q", "日本", "absent\\key"};
  for (const GenMember& m : o.members) keys.push_back(m.key);
  keys.push_back(to_utf8(gen.key()));
  return keys;
}

constexpr int kObjects = 3000;

TEST(ApiJsonScanProperty, GeneratorAgreesWithBoost) {
  JsonGen gen(1);
  for (int i = 0; i < kObjects; ++i) {
    const GenObject o = gen.object();
    boost::system::error_code ec;
    const json::value v = json::parse(o.text, ec);
    ASSERT_FALSE(ec) << o.text;
    ASSERT_EQ(v.as_object(), meaning(o)) << o.text;
  }
}

TEST(ApiJsonScanProperty, FindMemberReturnsTheLastMatchingMember) {
  JsonGen gen(2);
  for (int i = 0; i < kObjects; ++i) {
    const GenObject o = gen.object();
    for (const std::string& key : probe_keys(gen, o)) {
      const auto span = find_member(o.text, key);
      const GenMember* want = last_with_key(o, key);
      if (want == nullptr) {
        ASSERT_FALSE(span) << o.text << " key " << key;
        continue;
      }
      ASSERT_TRUE(span) << o.text << " key " << key;
      ASSERT_EQ(span->key_begin, want->key_begin) << o.text;
      ASSERT_EQ(span->value_begin, want->value_begin) << o.text;
      ASSERT_EQ(span->value_end, want->value_end) << o.text;
    }
  }
}

TEST(ApiJsonScanProperty, FindLastMemberReturnsTheLastMatchingMember) {
  JsonGen gen(7);
  for (int i = 0; i < kObjects; ++i) {
    const GenObject o = gen.object();
    for (const std::string& key : probe_keys(gen, o)) {
      const auto span = find_last_member(o.text, key);
      const GenMember* want = last_with_key(o, key);
      if (want == nullptr) {
        ASSERT_FALSE(span) << o.text << " key " << key;
        continue;
      }
      ASSERT_TRUE(span) << o.text << " key " << key;
      ASSERT_EQ(span->key_begin, want->key_begin) << o.text;
      ASSERT_EQ(span->value_begin, want->value_begin) << o.text;
      ASSERT_EQ(span->value_end, want->value_end) << o.text;
    }
  }
}

TEST(ApiJsonScanProperty, SetMemberMeansTheEditAndKeepsEveryOtherByte) {
  JsonGen gen(3);
  std::string out;
  for (int i = 0; i < kObjects; ++i) {
    const GenObject o = gen.object();
    for (const std::string& key : probe_keys(gen, o)) {
      const std::string value = gen.value(2);
      ASSERT_TRUE(set_member(o.text, key, value, out)) << o.text;

      json::object want = meaning(o);
      want[key] = json::parse(value);
      boost::system::error_code ec;
      const json::value got = json::parse(out, ec);
      ASSERT_FALSE(ec) << out;
      ASSERT_EQ(got.as_object(), want) << o.text << " set " << key << " -> " << out;

      std::size_t copies = 0;
      for (const GenMember& gm : o.members) copies += gm.key == key;
      if (copies > 1) {
        // Every copy removed, then the key inserted: no parser reads another value.
        std::string rest, want_text;
        ASSERT_TRUE(remove_member(o.text, key, rest));
        ASSERT_TRUE(set_member(rest, key, value, want_text));
        ASSERT_EQ(out, want_text) << o.text;
      } else if (const GenMember* m = last_with_key(o, key)) {
        // Replaced in place: everything outside the old value is untouched.
        ASSERT_EQ(out, o.text.substr(0, m->value_begin) + value + o.text.substr(m->value_end)) << o.text;
      } else {
        // Inserted right after '{': the input is intact on both sides.
        const std::size_t head = o.open + 1;
        const std::size_t tail = o.text.size() - head;
        ASSERT_GE(out.size(), o.text.size());
        ASSERT_EQ(out.substr(0, head), o.text.substr(0, head));
        ASSERT_EQ(out.substr(out.size() - tail), o.text.substr(head));
        std::string inserted = out.substr(head, out.size() - head - tail);
        ASSERT_EQ(!inserted.empty() && inserted.back() == ',', !o.members.empty()) << out;
        if (!o.members.empty()) inserted.pop_back();
        ASSERT_TRUE(inserted.ends_with(":" + value)) << inserted;
        ASSERT_EQ(json::parse("{" + inserted + "}").as_object(), (json::object{{key, json::parse(value)}}));
      }
      // And it can be found again where it was written.
      const auto again = find_member(out, key);
      ASSERT_TRUE(again);
      ASSERT_EQ(value_at(out, *again), value);
    }
  }
}

TEST(ApiJsonScanProperty, RemoveMemberMeansTheEditAndKeepsOtherMembersVerbatim) {
  JsonGen gen(4);
  std::string out;
  for (int i = 0; i < kObjects; ++i) {
    const GenObject o = gen.object();
    for (const std::string& key : probe_keys(gen, o)) {
      ASSERT_TRUE(remove_member(o.text, key, out)) << o.text;
      json::object want = meaning(o);
      want.erase(key);
      boost::system::error_code ec;
      const json::value got = json::parse(out, ec);
      ASSERT_FALSE(ec) << o.text << " remove " << key << " -> " << out;
      ASSERT_EQ(got.as_object(), want) << o.text << " remove " << key << " -> " << out;
      ASSERT_FALSE(find_member(out, key));
      if (!last_with_key(o, key)) {
        ASSERT_EQ(out, o.text);
        continue;
      }
      // The kept members appear verbatim and in order; the text before the
      // first member and after the last one is kept.
      std::size_t pos = 0;
      for (const GenMember& m : o.members) {
        if (m.key == key) continue;
        const std::string_view member(o.text.data() + m.key_begin, m.value_end - m.key_begin);
        const std::size_t at = out.find(member, pos);
        ASSERT_NE(at, std::string::npos) << o.text << " -> " << out;
        pos = at + member.size();
      }
      ASSERT_EQ(out.substr(0, o.members.front().key_begin), o.text.substr(0, o.members.front().key_begin));
      const std::size_t tail = o.text.size() - o.members.back().value_end;
      ASSERT_EQ(out.substr(out.size() - tail), o.text.substr(o.members.back().value_end));
    }
  }
}

// repeated_member: the first top-level name given twice (compared unescaped, in the order of the second
// copies); nested repeats are no top-level ones; with `distinct` (a DOM's size) equal to the count, nothing.
TEST(JsonScan, RepeatedMemberNamesTheFirstRepeatedTopLevelName) {
  EXPECT_EQ(repeated_member(R"({"a":1,"b":2})"), std::nullopt);
  EXPECT_EQ(repeated_member(R"({})"), std::nullopt);
  EXPECT_EQ(repeated_member(R"({"model":"a","model":"b"})"), "model");
  EXPECT_EQ(repeated_member(R"({"b":1,"a":{"b":2,"b":3},"c":[{"c":1}],"a":4,"b":5})"), "a");
  EXPECT_EQ(repeated_member(R"({"mod\u0065l":1,"x":2,"model":3})"), "model");
  EXPECT_EQ(repeated_member(R"({"\ud83d\ude00":1,"\ud83d\ude00":2})"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(repeated_member(R"( {"a":"}","a":"{"} )"), "a");
  // Not an object: nothing (the validating parse says why).
  EXPECT_EQ(repeated_member(R"([1,1])"), std::nullopt);
  EXPECT_EQ(repeated_member(R"({"a":1,"a")"), std::nullopt);
  // A DOM's size: equal to the members, nothing repeats.
  EXPECT_EQ(repeated_member(R"({"a":1,"b":2})", 2), std::nullopt);
  EXPECT_EQ(repeated_member(R"({"a":1,"a":2})", 1), "a");
  const std::string body = R"({"model":"a","model":"b","c":1})";
  EXPECT_EQ(repeated_member(body, json::parse(body).as_object().size()), "model");
}

}  // namespace
}  // namespace weir::api
