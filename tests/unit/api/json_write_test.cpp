// Compact JSON text of a DOM (api/json_write.hpp): byte for byte what boost::json::serialize writes for
// everything but doubles; doubles as Python's json writes them, reading back as the same double.
#include "api/json_write.hpp"

#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace weir::api {
namespace {

namespace json = boost::json;

std::string written(std::string_view text) { return to_json(json::parse(text)); }

TEST(JsonWrite, DoublesAreWrittenAsPythonWritesThem) {
  EXPECT_EQ(written("0.7"), "0.7");
  EXPECT_EQ(written("100.0"), "100.0");
  EXPECT_EQ(written("1e2"), "100.0");
  EXPECT_EQ(written("-0.0"), "-0.0");
  EXPECT_EQ(written("1.5e-7"), "1.5e-07");
  EXPECT_EQ(written("1e21"), "1e+21");
  EXPECT_EQ(written("3.141592653589793238"), "3.141592653589793");
  EXPECT_EQ(written("0.1"), "0.1");
  EXPECT_EQ(written("[0.5,2.25,-7.125]"), "[0.5,2.25,-7.125]");
  EXPECT_EQ(written(R"({"temperature":0.7,"top_p":0.95})"), R"({"temperature":0.7,"top_p":0.95})");
}

TEST(JsonWrite, IntegersStayExact) {
  EXPECT_EQ(written("0"), "0");
  EXPECT_EQ(written("-9223372036854775808"), "-9223372036854775808");
  EXPECT_EQ(written("18446744073709551615"), "18446744073709551615");
  EXPECT_EQ(written("[1,-2,3]"), "[1,-2,3]");
}

TEST(JsonWrite, ANumberBeyondADoubleIsStillJson) {
  // Boost.JSON 1.81's serializer writes these as `Infinity` and `-Infinity`: no JSON.
  EXPECT_EQ(written("1e400"), "1e999");
  EXPECT_EQ(written("-1e400"), "-1e999");
  EXPECT_EQ(written("1e-400"), "0.0");
  const json::value back = json::parse(written(R"({"a":[1e400,-1e400]})"));
  EXPECT_TRUE(std::isinf(back.at("a").at(0).as_double()));
  EXPECT_LT(back.at("a").at(1).as_double(), 0);
  EXPECT_EQ(to_json(json::value(std::numeric_limits<double>::quiet_NaN())), "null");
}

TEST(JsonWrite, EveryDoubleReadsBackAsItself) {
  // std::from_chars reads exactly (Python's float() too); Boost.JSON 1.81's own parse is off by an ulp for
  // some literals with extreme exponents, whichever way they are written.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::uint64_t bits = rng();
    double d = 0;
    std::memcpy(&d, &bits, sizeof d);
    if (!std::isfinite(d)) continue;
    const std::string text = to_json(json::value(d));
    double back = 0;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), back);
    ASSERT_EQ(r.ec, std::errc()) << text;
    ASSERT_EQ(r.ptr, text.data() + text.size()) << text;
    EXPECT_EQ(back, d) << text;
    EXPECT_NE(text.find_first_of(".e"), std::string::npos) << text;  // a float stays a float
  }
  // Values as requests carry them (sampling parameters, tool arguments): Boost.JSON reads them back too.
  for (int i = 0; i < 20000; ++i) {
    const double d = static_cast<double>(static_cast<std::int64_t>(rng() % 2000001) - 1000000) /
                     std::pow(10.0, static_cast<double>(rng() % 8));
    EXPECT_EQ(json::parse(to_json(json::value(d))).as_double(), d);
  }
}

// A random DOM without doubles: strings with every byte that has an escape, nesting, empty containers.
json::value random_value(std::mt19937& rng, int depth) {
  const int pick = static_cast<int>(rng() % (depth > 6 ? 5 : 7));
  switch (pick) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return static_cast<std::int64_t>(rng()) - static_cast<std::int64_t>(rng());
    case 3:
      return static_cast<std::uint64_t>(rng()) << 40;
    case 4: {
      std::string s;
      const std::size_t n = rng() % 12;
      for (std::size_t k = 0; k < n; ++k) {
        const unsigned r = rng() % 6;
        s += r == 0 ? static_cast<char>(rng() % 0x20) : r == 1 ? '"' : r == 2 ? '\\' : r == 3 ? '\x7f' : 'a';
        if (r == 4) s += "\xc3\xa9\xe2\x80\xa8";  // é, U+2028: written as they are
      }
      return json::value(json::string(s));
    }
    case 5: {
      json::array a;
      const std::size_t n = rng() % 4;
      for (std::size_t k = 0; k < n; ++k) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json::object o;
      const std::size_t n = rng() % 4;
      for (std::size_t k = 0; k < n; ++k)
        o[std::string(1, static_cast<char>('a' + rng() % 3)) + "\n\""] = random_value(rng, depth + 1);
      return o;
    }
  }
}

TEST(JsonWrite, WithoutDoublesTheBytesAreBoostJsons) {
  std::mt19937 rng(11);
  for (int i = 0; i < 5000; ++i) {
    const json::value v = random_value(rng, 0);
    ASSERT_EQ(to_json(v), json::serialize(v));
  }
}

TEST(JsonWrite, DeepNestingIsALoopNotRecursion) {
  std::string text(10000, '[');
  text.append(10000, ']');
  json::parse_options opt;
  opt.max_depth = 20000;  // (tool_call_stream reads arguments 10000 deep)
  const json::value v = json::parse(text, {}, opt);
  EXPECT_EQ(to_json(v), text);
}

TEST(JsonWrite, AppendsToWhatIsThere) {
  std::string out = "x=";
  append_json(out, json::parse(R"({"a":0.25})"));
  EXPECT_EQ(out, R"(x={"a":0.25})");
}

}  // namespace
}  // namespace weir::api
