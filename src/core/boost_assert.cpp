// Boost's assertion handler for debug builds (BOOST_ENABLE_ASSERT_DEBUG_HANDLER,
// set by the top CMakeLists.txt where CMAKE_BUILD_TYPE is Debug; with NDEBUG
// Boost's asserts compile to nothing and this file is not built).
//
// Every failed BOOST_ASSERT / BOOST_ASSERT_MSG aborts as <cassert>'s assert
// does, with the same message, except one that is known to be false: Beast's
// basic_parser::parse_chunk_header asserts `n >= 5` (beast/http/impl/
// basic_parser.ipp) when it resumes a chunked body whose last chunk "0\r\n"
// came in one read and its final "\r\n" in the next. Only 3 or 4 bytes are
// there then, which is valid: the code after it finds no end of message and
// asks for more (error::need_more), and the release build, without the
// assert, parses the body correctly. An upstream's empty chunked body split
// so aborted the debug and ASan builds. Fixed upstream in boostorg/beast PR
// #2861 (merged 2024-05-11; Beast version 354, Boost 1.86), which relaxes the
// assert to `n >= 3` when no CRLF is expected before the chunk size. Holding
// bytes back so the parser never sees the split would delay relayed SSE
// bytes in every build for a debug-only check; this costs nothing in release.
// With a Beast that has the fix the exception compiles away.
#include <boost/assert.hpp>
#include <boost/beast/version.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(BOOST_ENABLE_ASSERT_DEBUG_HANDLER) && !defined(NDEBUG)

namespace {

// Beast before version 354 (boostorg/beast PR #2861).
constexpr bool kBeastChunkAssertIsFalse = BOOST_BEAST_VERSION < 354;

bool ends_with(const char* s, const char* suffix) {
  const std::size_t n = std::strlen(s), m = std::strlen(suffix);
  return n >= m && std::strcmp(s + n - m, suffix) == 0;
}

// True for exactly the one known-false assertion (above).
bool known_false(const char* expr, const char* file) {
  return kBeastChunkAssertIsFalse && std::strcmp(expr, "n >= 5") == 0 &&
         ends_with(file, "beast/http/impl/basic_parser.ipp");
}

[[noreturn]] void fail(const char* expr, const char* msg, const char* function, const char* file, long line) {
  // assert()'s message (glibc's __assert_fail), so logs and tests read the same.
  std::fprintf(stderr, "%s:%ld: %s: Assertion `%s%s%s' failed.\n", file, line, function, expr, msg ? " && " : "",
               msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace

namespace boost {

void assertion_failed(const char* expr, const char* function, const char* file, long line) {
  if (known_false(expr, file)) return;
  fail(expr, nullptr, function, file, line);
}

void assertion_failed_msg(const char* expr, const char* msg, const char* function, const char* file, long line) {
  fail(expr, msg, function, file, line);
}

}  // namespace boost

#endif
