// api::lax_int: a count sent as a JSON string, read as vLLM's pydantic
// models read an int in lax mode.
#include "api/lax_int.hpp"

#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include <gtest/gtest.h>

namespace weir::api {
namespace {

// vLLM's pydantic models (lax mode) read a count given as a string as the
// integer it holds: so does Weir's estimate, where it refused them with its
// own 400. What pydantic 2.14 takes and refuses (checked against it).
TEST(ApiLaxInt, ReadsWhatPydanticReadsAsAnInt) {
  // clang-format off
  const std::pair<std::string_view, std::int64_t> taken[] = {
      {"3", 3}, {" 3", 3}, {"3 ", 3}, {"\t\n3\r\f\v", 3}, {"+3", 3}, {"-3", -3}, {"03", 3}, {"00", 0}, {"-0", 0},
      {"1_000", 1000}, {"1_0_0", 100}, {"0_3", 3}, {"3.0", 3}, {"3.000", 3}, {"3_000.000", 3000}, {" +3.0 ", 3},
      // Unicode White_Space, each end: U+0085, U+00A0, U+1680, U+2000, U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
      {"\u00853\u0085", 3}, {"\u00a03\u00a0", 3}, {"\u16803\u1680", 3}, {"\u20003\u2000", 3}, {"\u200a3\u200a", 3},
      {"\u20283\u2028", 3}, {"\u20293\u2029", 3}, {"\u202f3\u202f", 3}, {"\u205f3\u205f", 3}, {"\u30003\u3000", 3},
      {"9223372036854775807", 9223372036854775807LL},
      {"99999999999999999999999", std::numeric_limits<std::int64_t>::max()},
      {"-99999999999999999999999", std::numeric_limits<std::int64_t>::min()},
  };
  // clang-format on
  for (const auto& [text, want] : taken) {
    SCOPED_TRACE(text);
    const auto got = lax_int(text);
    ASSERT_TRUE(got);
    EXPECT_EQ(*got, want);
  }
  // clang-format off
  const std::string_view refused_texts[] = {
      "", " ", "+", "-", "3.5", "3.", ".0", "3.0_0", "3_.0", "3.0.0", "3e0", "1e3", "0x10", "inf", "1__0", "_1", "1_",
      "+_3", "--3", "+-3", "+ 3", "3 .0", "three", "3a", "3\xc2",
      "\u0663", "\u200b3", "\ufeff3", "\x1c" "3", "3\x1f", std::string_view("\0" "3", 2), std::string_view("3\0", 2)};
  // clang-format on
  for (const std::string_view text : refused_texts) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(lax_int(text));
  }
}

}  // namespace
}  // namespace weir::api
