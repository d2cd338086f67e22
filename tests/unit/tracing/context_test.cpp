// W3C Trace Context: traceparent and tracestate as the specification's test
// suite reads them (https://github.com/w3c/trace-context/tree/main/test),
// ids, and the parent-based ratio sampler.
#include "tracing/context.hpp"

#include <set>

#include <gtest/gtest.h>

namespace weir::tracing {
namespace {

constexpr std::string_view kValid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

std::string hex(const TraceId& t) {
  std::string s;
  append_hex(s, t);
  return s;
}
std::string hex(const SpanId& t) {
  std::string s;
  append_hex(s, t);
  return s;
}

TEST(TraceparentTest, ParsesAValidOne) {
  auto p = parse_traceparent(kValid);
  ASSERT_TRUE(p);
  EXPECT_EQ(hex(p->trace_id), "0af7651916cd43dd8448eb211c80319c");
  EXPECT_EQ(hex(p->span_id), "b7ad6b7169203331");
  EXPECT_TRUE(p->sampled());
  auto unsampled = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
  ASSERT_TRUE(unsampled);
  EXPECT_FALSE(unsampled->sampled());
  // Other flag bits are kept; only bit 0 is "sampled".
  auto other = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-09");
  ASSERT_TRUE(other);
  EXPECT_TRUE(other->sampled());
  EXPECT_EQ(other->flags, 0x09);
  // Surrounding whitespace (OWS) is not part of the value.
  EXPECT_TRUE(parse_traceparent(std::string(" \t") + std::string(kValid) + " "));
}

TEST(TraceparentTest, RefusesInvalidOnesWithoutError) {
  const char* bad[] = {
      "",
      "00",
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",    // short flags
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-",  // version 00 must be exactly 55
      "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",   // uppercase
      "00-00000000000000000000000000000000-b7ad6b7169203331-01",   // zero trace id
      "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",   // zero parent id
      "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   // version ff
      "0g-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   // bad version
      "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   // separator
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01x",   // shifted
      "00-0af7651916cd43dd8448eb211c8031-9cb7ad6b7169203331-01",   // misplaced dash
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-zz",   // bad flags
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\x01",
  };
  for (const char* v : bad) EXPECT_FALSE(parse_traceparent(v)) << v;
}

TEST(TraceparentTest, FutureVersionsAreReadByTheirFirstFields) {
  // §4.3: a higher version with more fields after a '-' is parsed as 00.
  EXPECT_TRUE(parse_traceparent("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-holds"));
  EXPECT_TRUE(parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
  EXPECT_FALSE(parse_traceparent("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01.what"));
}

TEST(TraceparentTest, FormatsWhatItParses) {
  IdGenerator g(42);
  const TraceId t = g.trace_id();
  const SpanId s = g.span_id();
  TraceparentText out;
  format_traceparent(out, t, s, true);
  const std::string text(out.data(), out.size());
  auto p = parse_traceparent(text);
  ASSERT_TRUE(p) << text;
  EXPECT_EQ(p->trace_id, t);
  EXPECT_EQ(p->span_id, s);
  EXPECT_TRUE(p->sampled());
  format_traceparent(out, t, s, false);
  EXPECT_EQ(std::string(out.data(), out.size()).substr(52), "-00");
}

TEST(TracestateTest, NormalizesValidLists) {
  std::string out;
  EXPECT_TRUE(normalize_tracestate("congo=t61rcWkgMzE", out));
  EXPECT_EQ(out, "congo=t61rcWkgMzE");
  EXPECT_TRUE(normalize_tracestate(" rojo=00f067aa0ba902b7 ,\t, congo=t61rcWkgMzE ", out));
  EXPECT_EQ(out, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  EXPECT_TRUE(normalize_tracestate("fw529a3039@dt=ZGQ2,vendor-1*/x=a b", out));
  EXPECT_EQ(out, "fw529a3039@dt=ZGQ2,vendor-1*/x=a b");
  EXPECT_TRUE(normalize_tracestate("", out));
  EXPECT_EQ(out, "");
}

TEST(TracestateTest, RefusesInvalidListsWhole) {
  const char* bad[] = {
      "Rojo=1",               // upper-case key
      "1rojo=1",              // simple key starting with a digit
      "rojo",                 // no '='
      "rojo=",                // empty value
      "rojo=a,rojo=b",        // a key twice
      "rojo=a=b",             // '=' in the value
      "t@Sys=1",              // system id upper-case
      "t@s23456789012345=1",  // system id too long
      "rojo=\x7f",
  };
  std::string out = "x";
  for (const char* v : bad) {
    EXPECT_FALSE(normalize_tracestate(v, out)) << v;
    EXPECT_EQ(out, "") << v;
  }
  std::string many;
  for (int i = 0; i < 33; ++i) many += "k" + std::to_string(i) + "=v,";
  EXPECT_FALSE(normalize_tracestate(many, out));  // more than 32 members
}

TEST(TracestateTest, LongListsLoseLongMembersFirstThenTheirTail) {
  std::string big(200, 'x');
  std::string value = "a=1,b=" + big + ",c=2";
  for (int i = 0; i < 25; ++i) value += ",k" + std::to_string(i) + "=" + std::string(30, 'v');
  std::string out;
  ASSERT_TRUE(normalize_tracestate(value, out, 512));
  EXPECT_LE(out.size(), 512u);
  EXPECT_TRUE(out.starts_with("a=1,c=2,k0=vvvv"));
  EXPECT_EQ(out.find("b="), std::string::npos);
  EXPECT_NE(out.find(",k10="), std::string::npos);
  EXPECT_EQ(out.find(",k24="), std::string::npos);  // the tail went
  // Surrounding whitespace is OWS, not part of a value.
  ASSERT_TRUE(normalize_tracestate("rojo=a b ", out));
  EXPECT_EQ(out, "rojo=a b");
}

TEST(IdGeneratorTest, IdsAreValidAndDistinct) {
  IdGenerator g;
  std::set<std::string> seen;
  for (int i = 0; i < 10'000; ++i) {
    const auto t = g.trace_id();
    const auto s = g.span_id();
    ASSERT_TRUE(t.valid());
    ASSERT_TRUE(s.valid());
    seen.insert(hex(t));
  }
  EXPECT_EQ(seen.size(), 10'000u);
}

TEST(SamplerTest, RatioOfRootTracesAndEdges) {
  IdGenerator g(7);
  const Sampler none(0.0), all(1.0), quarter(0.25);
  int sampled = 0;
  constexpr int kN = 100'000;
  for (int i = 0; i < kN; ++i) {
    const auto t = g.trace_id();
    EXPECT_FALSE(none.root_sampled(t));
    EXPECT_TRUE(all.root_sampled(t));
    sampled += quarter.root_sampled(t);
  }
  EXPECT_NEAR(static_cast<double>(sampled) / kN, 0.25, 0.01);
  // The decision depends on the id only: every replica agrees.
  const auto t = g.trace_id();
  EXPECT_EQ(Sampler(0.5).root_sampled(t), Sampler(0.5).root_sampled(t));
}

}  // namespace
}  // namespace weir::tracing
