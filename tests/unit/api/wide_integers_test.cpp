// Integers beyond 64 bits through a Boost.JSON DOM (api/wide_integers.hpp):
// protected as tokens, restored exactly, also inside strings; everything
// else untouched; a client cannot forge a token.
#include "api/wide_integers.hpp"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace weir::api {
namespace {

namespace json = boost::json;

// Parse → serialize, as a translator does, with the protection.
std::string round_trip(std::string_view text) {
  WideIntegers w;
  std::string storage;
  const json::value v = json::parse(w.protect(text, storage));
  std::string out = json::serialize(v);
  w.restore(out);
  return out;
}

TEST(WideIntegers, DetectsWhatBoostJsonWidened) {
  EXPECT_TRUE(has_wide_integer(json::parse(R"({"a":[1,{"b":18446744073709551616}]})")));
  EXPECT_TRUE(has_wide_integer(json::parse(R"([-9223372036854775809])")));
  EXPECT_FALSE(has_wide_integer(json::parse(R"({"a":18446744073709551615,"b":-9223372036854775808,"c":1.5})")));
}

TEST(WideIntegers, LiteralsComeBackExactly) {
  EXPECT_EQ(
      round_trip(
          R"({"max":18446744073709551616,"min":-99999999999999999999,"ok":12,"f":1.5,"s":"123456789012345678901234"})"),
      R"({"max":18446744073709551616,"min":-99999999999999999999,"ok":12,"f":1.5E0,"s":"123456789012345678901234"})");
  EXPECT_EQ(round_trip("[1e30, 18446744073709551615]"), "[1E30,18446744073709551615]");  // nothing to protect
}

TEST(WideIntegers, NumbersBeyondADoublesRangeComeBackExactly) {
  // Boost.JSON reads 1e400 as infinity and writes that as no JSON number.
  EXPECT_TRUE(has_wide_integer(json::parse(R"({"a":[1,{"b":1e400}]})")));
  EXPECT_TRUE(has_wide_integer(json::parse(R"([-1.5e999])")));
  EXPECT_EQ(round_trip(R"({"a":1e400,"b":-2.5E+999,"c":1e-400,"d":1.5,"e":[1E400]})"),
            R"({"a":1e400,"b":-2.5E+999,"c":1e-400,"d":1.5E0,"e":[1E400]})");
}

TEST(WideIntegers, TokensEmbeddedInStringsAreRestoredToo) {
  WideIntegers w;
  std::string storage;
  const json::value v = json::parse(w.protect(R"({"n":123456789012345678901234567890})", storage));
  // A translator serializing an object into a string member (tool call arguments).
  json::object outer;
  outer["arguments"] = json::serialize(v);
  json::object deeper;
  deeper["x"] = json::serialize(outer);
  std::string out = json::serialize(outer);
  w.restore(out);
  EXPECT_EQ(out, R"({"arguments":"{\"n\":123456789012345678901234567890}"})");
  out = json::serialize(deeper);
  w.restore(out);
  const json::value x = json::parse(json::parse(out).at("x").as_string());  // two levels of strings
  EXPECT_EQ(x.at("arguments"), R"({"n":123456789012345678901234567890})");
}

TEST(WideIntegers, AClientCannotForgeAToken) {
  // Strings that look like tokens, but without this object's nonce, stay strings.
  EXPECT_EQ(round_trip(R"({"a":"wi00000000000000000000000000000000_0","b":99999999999999999999})"),
            R"({"a":"wi00000000000000000000000000000000_0","b":99999999999999999999})");
  WideIntegers w;
  std::string s = R"({"a":"nothing here"})";
  w.restore(s);
  EXPECT_EQ(s, R"({"a":"nothing here"})");
}

}  // namespace
}  // namespace weir::api
