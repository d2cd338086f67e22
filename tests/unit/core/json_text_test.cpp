// append_json_string writes valid JSON for any bytes (issue 8, defect 6):
// every output is parsed back with Boost.JSON (which refuses invalid UTF-8).
#include "core/json_text.hpp"
#include "core/text_writer.hpp"

#include <iterator>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <boost/json.hpp>

#include "api/json_scan.hpp"
#include "core/error.hpp"

namespace {

using weir::core::append_json_string;
using weir::core::utf8_prefix;

const std::string kFFFD = "\xEF\xBF\xBD";

std::string rep(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += kFFFD;
  return s;
}

// The literal `append_json_string` writes for `in`, parsed back: fails the
// test if it is not valid JSON.
std::string round_trip(std::string_view in) {
  std::string out;
  append_json_string(out, in);
  boost::system::error_code ec;
  auto v = boost::json::parse(out, ec);
  EXPECT_FALSE(ec) << ec.message() << " for " << ::testing::PrintToString(out);
  if (ec || !v.is_string()) return "<invalid>";
  return std::string(v.get_string());
}

}  // namespace

TEST(JsonText, EscapesAsciiAndRoundTripsIt) {
  std::string all;
  for (int c = 0; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  EXPECT_EQ(round_trip(all), all);
  std::string out;
  append_json_string(out, "a\"b\\c\n\r\t\b\f\x01\x1f\x7f");
  EXPECT_EQ(out, R"("a\"b\\c\n\r\t\b\f\u0001\u001f\u007f")");
}

// DEFECT: DEL and the C1 controls (U+0080..U+009F) were written raw into the access log, the request log and
// `weir requests` output: a client's model "\u009b2J..." (CSI) drove the terminal of whoever tailed the log.
// They are escaped as the C0 controls are; U+00A0 and up pass as they are.
TEST(JsonText, DelAndC1ControlsAreEscaped) {
  std::string out;
  append_json_string(out,
                     "\x7f|\xC2\x80|\xC2\x9B"
                     "2J|\xC2\x9F|\xC2\xA0|\xC3\xA9");
  EXPECT_EQ(out, R"("\u007f|\u0080|\u009b2J|\u009f|)"
                 "\xC2\xA0|\xC3\xA9\"");
  for (int c = 0x80; c <= 0x9F; ++c) {
    const std::string in = {'\xC2', static_cast<char>(c)};
    EXPECT_EQ(round_trip(in), in) << c;  // (the escape reads back as the character)
  }
  // No raw byte 0x7F or C2 80..9F is left in any 2-byte string's literal.
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b) {
      std::string lit;
      append_json_string(lit, std::string{static_cast<char>(a), static_cast<char>(b)});
      ASSERT_EQ(lit.find('\x7f'), std::string::npos) << a << " " << b;
      for (std::size_t i = 0; i + 1 < lit.size(); ++i)
        ASSERT_FALSE(lit[i] == '\xC2' && static_cast<unsigned char>(lit[i + 1]) >= 0x80 &&
                     static_cast<unsigned char>(lit[i + 1]) <= 0x9F)
            << a << " " << b;
    }
}

// DEFECT: the request log's model, tenant and key_id columns were made valid UTF-8 with one U+FFFD per bad
// byte, the access log's line with one per bad sequence: a filter by the value the log showed found nothing,
// and the column could outgrow its 256-byte cap. One rule now (append_valid_utf8): the column is what the
// line's string decodes to, and from utf8_prefix(s, cap) it is at most cap bytes.
TEST(JsonText, AppendValidUtf8IsWhatTheLiteralDecodesTo) {
  std::mt19937 rng(47);
  for (int i = 0; i < 20000; ++i) {
    std::string in(rng() % 24, '\0');
    for (auto& ch : in) ch = static_cast<char>(rng() % 4 == 0 ? 0x20 + rng() % 0x60 : 0x80 + rng() % 0x80);
    std::string valid = "x";
    weir::core::append_valid_utf8(valid, in);
    ASSERT_EQ(valid, "x" + round_trip(in)) << ::testing::PrintToString(in);
    for (std::size_t cap : {0u, 5u, 9u, 16u}) {
      std::string capped;
      weir::core::append_valid_utf8(capped, utf8_prefix(in, cap));
      ASSERT_LE(capped.size(), cap) << ::testing::PrintToString(in);
    }
  }
  std::string truncated;
  weir::core::append_valid_utf8(truncated, "x\xF0\x9F\x98");
  EXPECT_EQ(truncated, "x" + rep(1));
}

TEST(JsonText, WellFormedUtf8PassesUnchanged) {
  for (std::string_view s : {"caf\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
                             "\xEF\xBF\xBD", "\xF4\x8F\xBF\xBF", "\xED\x9F\xBF", "\xEE\x80\x80", "\xF0\x90\x80\x80",
                             "\xE0\xA0\x80", "\xC2\xA0", "\xDF\xBF", "model-\xE6\xA8\xA1\xE5\x9E\x8B"}) {
    std::string out;
    append_json_string(out, s);
    EXPECT_EQ(out, "\"" + std::string(s) + "\"");  // byte for byte
    EXPECT_EQ(round_trip(s), s);
  }
}

TEST(JsonText, IllFormedSequencesBecomeReplacementCharacters) {
  struct Case {
    std::string_view in;
    std::string want;
  };
  // One U+FFFD per maximal ill-formed subpart (Unicode §3.9, WHATWG; Python's errors="replace").
  const Case cases[] = {
      {"\x80", rep(1)},  // lone continuation byte
      {"a\x80\xBF"
       "b",
       "a" + rep(2) + "b"},         // two of them
      {"\xC3", rep(1)},             // truncated 2-byte sequence at the end
      {"\xE2\x82", rep(1)},         // truncated 3-byte sequence
      {"\xE2\x82x", rep(1) + "x"},  // ... followed by ASCII
      {"\xF0\x9F\x98", rep(1)},     // truncated emoji
      {"\xF0\x9F\x98\xF0\x9F\x98\x80", rep(1) + "\xF0\x9F\x98\x80"},
      {"\xC0\xAF", rep(2)},  // overlong '/'
      {"\xC1\xBF", rep(2)},
      {"\xE0\x80\xAF", rep(3)},              // overlong, 3 bytes
      {"\xF0\x80\x80\xAF", rep(4)},          // overlong, 4 bytes
      {"\xED\xA0\x80", rep(3)},              // surrogate U+D800 encoded in UTF-8
      {"\xED\xBF\xBF", rep(3)},              // surrogate U+DFFF
      {"\xED\xA0\x80\xED\xB0\x80", rep(6)},  // a CESU-8 surrogate pair
      {"\xF4\x90\x80\x80", rep(4)},          // above U+10FFFF
      {"\xF5\x80\x80\x80", rep(4)},
      {"\xFE\xFF", rep(2)},
      {"\"\xFF\\", "\"" + rep(1) + "\\"},
  };
  for (const auto& c : cases) EXPECT_EQ(round_trip(c.in), c.want) << ::testing::PrintToString(std::string(c.in));
  for (int b = 0xF5; b <= 0xFF; ++b) EXPECT_EQ(round_trip(std::string(1, static_cast<char>(b))), rep(1)) << b;
}

TEST(JsonText, EveryByteSequenceGivesValidJson) {
  // Every 1- and 2-byte string, every 3-byte string with a non-ASCII lead,
  // and random strings: all parse.
  std::string in, out;
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      in.assign({static_cast<char>(a), static_cast<char>(b)});
      out.clear();
      append_json_string(out, in);
      boost::system::error_code ec;
      boost::json::parse(out, ec);
      ASSERT_FALSE(ec) << a << " " << b;
    }
  }
  for (int a = 0xC0; a < 256; ++a)
    for (int b = 0x80; b < 0xC0; ++b)
      for (int c = 0; c < 256; c += 3) {
        in.assign({static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)});
        out.clear();
        append_json_string(out, in);
        boost::system::error_code ec;
        boost::json::parse(out, ec);
        ASSERT_FALSE(ec) << a << " " << b << " " << c;
      }
  std::mt19937 rng(8);
  for (int i = 0; i < 20000; ++i) {
    in.resize(rng() % 24);
    for (auto& ch : in) ch = static_cast<char>(rng() % 4 == 0 ? rng() % 0x80 : 0x80 + rng() % 0x80);
    out.clear();
    append_json_string(out, in);
    boost::system::error_code ec;
    boost::json::parse(out, ec);
    ASSERT_FALSE(ec) << ::testing::PrintToString(in);
  }
}

TEST(JsonText, AppendsWithoutClearing) {
  std::string out = "x:";
  append_json_string(out, "\xFF");
  EXPECT_EQ(out, "x:\"" + kFFFD + "\"");
}

TEST(JsonText, Utf8PrefixCutsOnABoundary) {
  const std::string s =
      "ab\xF0\x9F\x98\x80"
      "cd";  // a, b, an emoji (4 bytes), c, d
  EXPECT_EQ(utf8_prefix(s, 100), s);
  EXPECT_EQ(utf8_prefix(s, 2), "ab");
  EXPECT_EQ(utf8_prefix(s, 3), "ab");
  EXPECT_EQ(utf8_prefix(s, 4), "ab");
  EXPECT_EQ(utf8_prefix(s, 5), "ab");
  EXPECT_EQ(utf8_prefix(s, 6), "ab\xF0\x9F\x98\x80");
  EXPECT_EQ(utf8_prefix(s, 7),
            "ab\xF0\x9F\x98\x80"
            "c");
  EXPECT_EQ(utf8_prefix("\xE2\x82\xAC", 2), "");
  EXPECT_EQ(utf8_prefix("\xE2\x82\xAC", 0), "");
  // Bytes that are not UTF-8 count as the U+FFFD each becomes (3 bytes):
  // the cap holds for what is written, not for what was read.
  EXPECT_EQ(utf8_prefix("\x80\x80\x80\x80\x80\x80", 5), "\x80");
  EXPECT_EQ(utf8_prefix("\x80\x80\x80\x80\x80\x80", 6), "\x80\x80");
  const std::string ff(400, '\xFF');
  EXPECT_EQ(utf8_prefix(ff, 256).size(), 85u);
  std::string written;
  weir::core::append_json_string(written, utf8_prefix(ff, 256));
  EXPECT_LE(written.size(), 256u + 2);  // and its quotes
  // A truncated sequence is one replacement: "\xE2\x82" then "a" is 3 + 1 bytes.
  EXPECT_EQ(utf8_prefix("\xE2\x82"
                        "a",
                        4),
            "\xE2\x82"
            "a");
  EXPECT_EQ(utf8_prefix("\xE2\x82"
                        "a",
                        3),
            "\xE2\x82");
}

// The ASCII fast path (eight bytes a step within the cap) hands over to
// the counting loop at the first non-ASCII byte, with what it passed counted.
TEST(JsonText, Utf8PrefixAsciiRunsThenOtherBytes) {
  const std::string ascii(20, 'a');
  EXPECT_EQ(utf8_prefix(ascii, 20), ascii);
  EXPECT_EQ(utf8_prefix(ascii, 19), ascii.substr(0, 19));
  EXPECT_EQ(utf8_prefix(ascii, 0), "");
  EXPECT_EQ(utf8_prefix("", 0), "");
  for (std::size_t run : {0u, 7u, 8u, 9u, 16u, 17u}) {
    SCOPED_TRACE(run);
    const std::string bad = std::string(run, 'a') + "\xFF\xFF";  // each 0xFF is written as 3 bytes
    EXPECT_EQ(utf8_prefix(bad, run + 2), bad.substr(0, run)) << "the first U+FFFD does not fit";
    EXPECT_EQ(utf8_prefix(bad, run + 3), bad.substr(0, run + 1));
    EXPECT_EQ(utf8_prefix(bad, run + 6), bad);
    const std::string emoji = std::string(run, 'a') + "\xF0\x9F\x98\x80" + "b";
    EXPECT_EQ(utf8_prefix(emoji, run + 4), emoji.substr(0, run + 4));
    EXPECT_EQ(utf8_prefix(emoji, run + 5), emoji);
    EXPECT_EQ(utf8_prefix(emoji, run + 3), emoji.substr(0, run));
  }
}

TEST(JsonText, ErrorBodiesThatEchoInputAreValidAndCapped) {
  const std::string model = "m\xFF\xED\xA0\x80" + std::string(5000, 'x');
  for (const auto& e :
       {weir::core::model_not_found(model), weir::core::not_found("/v1/\xC3"),
        weir::core::method_not_allowed("G\x80T", "/v1/\xF0\x9F\x98"), weir::core::bad_request("bad \xFF")}) {
    const std::string body = weir::core::error_json(e);
    boost::system::error_code ec;
    auto v = boost::json::parse(body, ec);
    ASSERT_FALSE(ec) << ec.message() << ": " << ::testing::PrintToString(body);
    EXPECT_TRUE(v.as_object().at("error").as_object().at("message").is_string());
  }
  EXPECT_LT(weir::core::model_not_found(model).message.size(), 400u);
  EXPECT_LT(weir::core::not_found(std::string(70000, 'p')).message.size(), 400u);
}

TEST(JsonText, JsonScanUsesTheSameEscaper) {
  std::string out;
  ASSERT_TRUE(weir::api::set_member("{\"a\":1}", "k\xFF\x01", "2", out));
  boost::system::error_code ec;
  auto v = boost::json::parse(out, ec);
  ASSERT_FALSE(ec) << ::testing::PrintToString(out);
  EXPECT_EQ(v.as_object().at("k" + kFFFD + "\x01").as_int64(), 2);
}

TEST(TextWriter, AppendsAfterWhatTheStringHeldAndTrimsTheRoom) {
  std::string out = "head:";
  {
    weir::core::TextWriter w(out, 4);  // less room than needed: grows
    w.put("abc");
    w.put(',');
    w.put_uint(18446744073709551615ull);
    w.put(',');
    w.put_int(-9223372036854775807ll - 1);
    w.put(',');
    w.put_scaled(-1234, 3);
    w.put(',');
    w.put_json_string("q\"\n\xFF");
  }
  const std::string expected = "head:abc,18446744073709551615,-9223372036854775808,-1.234,\"q\\\"\\n" + kFFFD + "\"";
  EXPECT_EQ(out, expected);
  weir::core::TextWriter w(out);  // room made, nothing written: the string is as it was
  w.finish();
  w.finish();  // idempotent
  EXPECT_EQ(out, expected);
}

TEST(TextWriter, EscapingGrowsGeometricallyAndMatchesTheStringForm) {
  // Every byte escaped (6 bytes each) and every byte replaced (3 each): the
  // same text as append_json_string, and capacity within a small factor of
  // the size (no 6 × n reservation for text that needs none).
  for (const std::string& s : {std::string(100'000, '\x01'), std::string(100'000, '\xFF'), std::string(100'000, 'a')}) {
    std::string a = "x", b = "x";
    weir::core::append_json_string(a, s);
    {
      weir::core::TextWriter w(b, 8);
      w.put_json_string(s);
    }
    EXPECT_EQ(a, b);
    boost::system::error_code ec;
    const auto v = boost::json::parse(std::string_view(a).substr(1), ec);
    ASSERT_FALSE(ec);
    EXPECT_LE(a.capacity(), 4 * a.size() + 512);  // room doubled, then the string's own doubling
  }
  std::string plain;
  weir::core::append_json_string(plain, std::string(100'000, 'a'));
  EXPECT_LE(plain.capacity(), plain.size() + 512);
}

// A log line's values (put_log_string): U+0000 is U+FFFD, which PostgreSQL's json and jsonb hold (\u0000 they
// refuse: one row with it failed every record::jsonb query over the request log); everything else as
// put_json_string writes it. put_json_string (error bodies, translated answers) keeps \u0000.
TEST(TextWriter, ALogStringWritesNulAsTheReplacementCharacter) {
  const auto log = [](std::string_view s) {
    std::string out;
    weir::core::TextWriter w(out);
    w.put_log_string(s);
    w.finish();
    return out;
  };
  using namespace std::string_view_literals;
  EXPECT_EQ(log("a\0b"sv),
            "\"a\xEF\xBF\xBD"
            "b\"");
  EXPECT_EQ(log("\0"sv), "\"\xEF\xBF\xBD\"");
  // Long (the 16-bytes-a-step scan) and among other escapes and bytes.
  EXPECT_EQ(log("0123456789abcdef\0\x01\"\xFF\xC3\xA9"sv),
            "\"0123456789abcdef\xEF\xBF\xBD\\u0001\\\"\xEF\xBF\xBD\xC3\xA9\"");
  // Without a NUL: put_json_string's text, byte for byte.
  for (std::string_view s : {"plain"sv, "tab\there \"q\" \x7F \xC2\x9B"sv, "\xED\xA0\x80 cut \xE2\x82"sv}) {
    std::string a;
    append_json_string(a, s);
    EXPECT_EQ(log(s), a);
  }
  // The request log's columns (append_log_text) say what the line's literal decodes to.
  for (std::string_view s : {"a\0b"sv, "\0\0"sv, "\0\xFF\0"sv, "plain"sv, "\xC3\xA9\0"sv}) {
    std::string col = "x";
    weir::core::append_log_text(col, s);
    const auto v = boost::json::parse(log(s));
    EXPECT_EQ(col, "x" + std::string(v.as_string()));
  }
  std::string kept;
  append_json_string(kept, "a\0b"sv);
  EXPECT_EQ(kept, "\"a\\u0000b\"");
}

TEST(JsonText, TheWordAtATimeScanMissesNoByteAtAnyPosition) {
  // One byte of every value at every position of 40 plain bytes: escaped
  // (or replaced) exactly as when it stands alone, whichever word it is in.
  const std::string plain = "The quick brown fox jumps over a lazy do";
  for (int v = 0; v < 256; ++v) {
    std::string alone;
    append_json_string(alone, std::string(1, static_cast<char>(v)));
    const std::string inner = alone.substr(1, alone.size() - 2);
    for (std::size_t at = 0; at <= plain.size(); ++at) {
      std::string in = plain;
      in.insert(at, 1, static_cast<char>(v));
      std::string out;
      append_json_string(out, in);
      EXPECT_EQ(out, "\"" + plain.substr(0, at) + inner + plain.substr(at) + "\"") << v << " at " << at;
    }
  }
}

TEST(JsonText, ShortStringsAndTailsMissNoByteAtAnyLength) {
  // The same at every length from 1 to 40 (the word-pair path of 1 to 16
  // bytes, the overlapping last step of 17 and more): one byte of every value
  // at every position, and two that need a look, the second in the tail.
  const std::string plain = "The quick brown fox jumps over a lazy do";
  for (std::size_t len = 1; len <= plain.size(); ++len) {
    const std::string base = plain.substr(0, len);
    std::string out;
    append_json_string(out, base);
    EXPECT_EQ(out, "\"" + base + "\"") << len;
    for (int v = 0; v < 256; ++v) {
      std::string alone;
      append_json_string(alone, std::string(1, static_cast<char>(v)));
      const std::string inner = alone.substr(1, alone.size() - 2);
      for (std::size_t at = 0; at < len; ++at) {
        std::string in = base;
        in[at] = static_cast<char>(v);
        out.clear();
        append_json_string(out, in);
        EXPECT_EQ(out, "\"" + base.substr(0, at) + inner + base.substr(at + 1) + "\"")
            << v << " at " << at << " of " << len;
      }
    }
    for (std::size_t a = 0; a < len; ++a)
      for (std::size_t b = a + 1; b < len; ++b) {
        std::string in = base;
        in[a] = '"';
        in[b] = '\n';
        out.clear();
        append_json_string(out, in);
        EXPECT_EQ(out,
                  "\"" + base.substr(0, a) + "\\\"" + base.substr(a + 1, b - a - 1) + "\\n" + base.substr(b + 1) + "\"")
            << a << "," << b << " of " << len;
      }
  }
}

TEST(JsonText, SequencesAndEscapesAcrossSixteenByteStepsAreKept) {
  // A well-formed 2-, 3- or 4-byte sequence, or two escapes in a row, at every
  // position of 40 plain bytes: unchanged (or escaped) whichever step it
  // straddles.
  const std::string plain = "The quick brown fox jumps over a lazy do";
  const std::pair<std::string, std::string> cases[] = {
      {"\xC3\xA9", "\xC3\xA9"},
      {"\xE2\x82\xAC", "\xE2\x82\xAC"},
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},
      {"\"\\", "\\\"\\\\"},
      {"\n\x01", "\\n\\u0001"},
      {"\xC3\x28", kFFFD + "("},  // ill-formed: the lead byte is replaced, the next byte kept
  };
  for (const auto& [in_bytes, written] : cases) {
    for (std::size_t at = 0; at <= plain.size(); ++at) {
      std::string in = plain;
      in.insert(at, in_bytes);
      std::string out;
      append_json_string(out, in);
      EXPECT_EQ(out, "\"" + plain.substr(0, at) + written + plain.substr(at) + "\"") << at;
    }
  }
}

namespace {

// The WHATWG Encoding Standard's UTF-8 decoder (§8.1.1, one byte at a time, an ill-formed byte after a
// lead byte is read again), writing each decoded character's bytes as they came and U+FFFD for each error:
// what Python's bytes.decode("utf-8", "replace") gives, written independently of json_text.cpp's table.
std::string whatwg_decode(std::string_view in) {
  std::string out, seq;
  int needed = 0, seen = 0;
  unsigned lower = 0x80, upper = 0xBF;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto b = static_cast<unsigned char>(in[i]);
    if (needed == 0) {
      if (b <= 0x7F) {
        out += static_cast<char>(b);
      } else if (b >= 0xC2 && b <= 0xDF) {
        needed = 1;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower = 0xA0;
        if (b == 0xED) upper = 0x9F;
        needed = 2;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower = 0x90;
        if (b == 0xF4) upper = 0x8F;
        needed = 3;
      } else {
        out += kFFFD;
      }
      if (needed != 0) seq.assign(1, static_cast<char>(b));
      continue;
    }
    if (b < lower || b > upper) {
      needed = seen = 0;
      lower = 0x80;
      upper = 0xBF;
      seq.clear();
      out += kFFFD;
      --i;  // the byte is read again
      continue;
    }
    lower = 0x80;
    upper = 0xBF;
    seq += static_cast<char>(b);
    if (++seen == needed) {
      out += seq;
      needed = seen = 0;
      seq.clear();
    }
  }
  if (needed != 0) out += kFFFD;
  return out;
}

// Well-formed: the decoder gives the bytes back (a replacement never writes the bytes it replaced).
bool well_formed(std::string_view in) { return whatwg_decode(in) == in; }

}  // namespace

// An upstream's ill-formed UTF-8 reached OpenAI clients byte for byte (the openai SDK raised
// UnicodeDecodeError mid-stream). The relay now replaces it as Python's errors="replace" does: these
// outputs are Python 3's bytes.decode("utf-8", "replace") of each input, re-encoded.
TEST(JsonText, ReplacementMatchesPythonsDecodeReplace) {
  struct Case {
    std::string_view in;
    std::string_view python;
    std::size_t replaced;
  };
  const Case cases[] = {
      {"\xFF", "\xEF\xBF\xBD", 1},
      {"a\xC0\x80"
       "b",
       "a\xEF\xBF\xBD\xEF\xBF\xBD"
       "b",
       2},                                                                          // overlong NUL
      {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3},                  // a surrogate
      {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 4},  // U+110000
      {"\xE2\x82", "\xEF\xBF\xBD", 1},                                              // cut short at the end
      {"\xF0\x9F\x98x", "\xEF\xBF\xBDx", 1},
      {"\xE0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3},
      {"\xF8\x88\x80\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 5},
      {"\xC1\xBF", "\xEF\xBF\xBD\xEF\xBF\xBD", 2},
      {"\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41",
       "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
       "A",
       4},
      {"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64",
       "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
       "b\xEF\xBF\xBD"
       "c\xEF\xBF\xBD\xEF\xBF\xBD"
       "d",
       6},  // Unicode §3.9's own example of maximal subparts (Table 3-8)
      {"\xED\x9F\xBF\xED\xA0\x80", "\xED\x9F\xBF\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3},
      {"\xF4\x8F\xBF\xBF\xF4\x90", "\xF4\x8F\xBF\xBF\xEF\xBF\xBD\xEF\xBF\xBD", 2},
      {"\xC2\x41",
       "\xEF\xBF\xBD"
       "A",
       1},
      {"\xEF\xBF\xBD", "\xEF\xBF\xBD", 0},
      {"\x80\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3},
  };
  for (const auto& c : cases) {
    std::string out = "<";
    EXPECT_EQ(weir::core::append_valid_utf8(out, c.in), c.replaced) << ::testing::PrintToString(c.in);
    EXPECT_EQ(out, "<" + std::string(c.python)) << ::testing::PrintToString(c.in);
    EXPECT_EQ(whatwg_decode(c.in), c.python) << ::testing::PrintToString(c.in);  // (the reference agrees)
    EXPECT_EQ(weir::core::find_invalid_utf8(c.in) == std::string_view::npos, c.replaced == 0);
  }
}

// Every string of up to three bytes from the bytes where the table's ranges turn (and ASCII), and random
// longer ones: append_valid_utf8 gives the WHATWG decoder's output, and find_invalid_utf8 finds the first
// ill-formed byte (the bytes before it decode as they are), wherever it lies against the 8- and 16-byte
// steps of its ASCII scan.
TEST(JsonText, FindInvalidUtf8AndReplacementAgreeWithTheDecoder) {
  const unsigned char edges[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                                 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
  auto check = [](const std::string& in) {
    std::string out;
    const std::size_t n = weir::core::append_valid_utf8(out, in);
    ASSERT_EQ(out, whatwg_decode(in)) << ::testing::PrintToString(in);
    const std::size_t at = weir::core::find_invalid_utf8(in);
    ASSERT_EQ(at == std::string_view::npos, n == 0) << ::testing::PrintToString(in);
    if (at != std::string_view::npos) {
      ASSERT_TRUE(well_formed(std::string_view(in).substr(0, at))) << ::testing::PrintToString(in) << " " << at;
      // The replacement's first U+FFFD stands where that byte stood.
      ASSERT_EQ(out.substr(0, at + 3), in.substr(0, at) + kFFFD) << ::testing::PrintToString(in);
    }
  };
  std::vector<std::string> shorts = {""};
  for (int len = 1; len <= 3; ++len) {
    std::vector<std::string> next;
    for (const auto& s : shorts)
      if (static_cast<int>(s.size()) == len - 1)
        for (unsigned char b : edges) next.push_back(s + static_cast<char>(b));
    for (auto& s : next) check(s);
    shorts.insert(shorts.end(), next.begin(), next.end());
  }
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b) check(std::string{static_cast<char>(a), static_cast<char>(b)});
  std::mt19937 rng(50);
  const std::string pieces[] = {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF"};
  for (int i = 0; i < 20000; ++i) {
    std::string in;
    const std::size_t len = rng() % 48;
    while (in.size() < len) {
      const unsigned r = rng() % 16;
      if (r < 10)
        in += static_cast<char>('a' + rng() % 26);  // runs of ASCII across the scan's steps
      else if (r < 13)
        in += pieces[rng() % std::size(pieces)];
      else
        in += static_cast<char>(edges[rng() % std::size(edges)]);
    }
    check(in);
  }
}

// ascii_prefix() stops at or before the first non-ASCII byte, wherever it lies against its 32- and 16-byte
// steps and its overlapping last load, and takes all of a text that has none.
TEST(JsonText, AsciiPrefixNeverPassesANonAsciiByte) {
  for (std::size_t n = 0; n <= 100; ++n) {
    const std::string plain(n, 'a');
    EXPECT_EQ(weir::core::ascii_prefix(plain), n);
    for (std::size_t at = 0; at < n; ++at) {
      for (const char c : {'\x80', '\xFF', '\xC3'}) {
        std::string in = plain;
        in[at] = c;
        const std::size_t got = weir::core::ascii_prefix(in);
        ASSERT_LE(got, at) << n << " " << at;
        ASSERT_LE(at - got, 31u) << n << " " << at;
      }
    }
  }
}

// The ASCII scan misses no byte: one ill-formed or non-ASCII byte at every position of a long ASCII text.
TEST(JsonText, FindInvalidUtf8SeesEveryPosition) {
  const std::string plain(100, 'x');
  EXPECT_EQ(weir::core::find_invalid_utf8(plain), std::string_view::npos);
  EXPECT_EQ(weir::core::find_invalid_utf8(""), std::string_view::npos);
  for (std::size_t at = 0; at <= plain.size(); ++at) {
    for (std::string_view bad : {"\xFF", "\x80", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82"}) {
      std::string in = plain;
      in.insert(at, bad);
      EXPECT_EQ(weir::core::find_invalid_utf8(in), at) << ::testing::PrintToString(bad) << " at " << at;
    }
    for (std::string_view good : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}) {
      std::string in = plain;
      in.insert(at, good);
      EXPECT_EQ(weir::core::find_invalid_utf8(in), std::string_view::npos) << at;
    }
    // A sequence cut short by the end of the text is ill-formed where it starts.
    EXPECT_EQ(weir::core::find_invalid_utf8(plain.substr(0, at) + "\xF0\x9F\x98"), at);
  }
}
