// Weir's own socket shortages (http/shortage.hpp): which errors are one, the
// rate-limited stderr report of a recurring one, and the probe and fetch of
// probe.hpp telling a socket Weir could not open (EMFILE) from a failing
// endpoint.
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "http/probe.hpp"
#include "http/shortage.hpp"
#include "io_test_util.hpp"

namespace {

using namespace weir;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

boost::system::error_code sys(int e) { return {e, boost::system::system_category()}; }

TEST(Shortage, OnlyWeirsOwnResourcesAreShortages) {
  EXPECT_EQ(http::shortage_of(sys(EMFILE)), http::Shortage::fds);
  EXPECT_EQ(http::shortage_of(sys(ENFILE)), http::Shortage::system_fds);
  EXPECT_EQ(http::shortage_of(sys(ENOBUFS)), http::Shortage::memory);
  EXPECT_EQ(http::shortage_of(sys(ENOMEM)), http::Shortage::memory);
  EXPECT_EQ(http::shortage_of(sys(EADDRNOTAVAIL)), http::Shortage::ports);
  EXPECT_EQ(http::shortage_of(asio::error::no_descriptors), http::Shortage::fds);
  for (int e : {ECONNREFUSED, ECONNRESET, ETIMEDOUT, EHOSTUNREACH, ENETUNREACH, EPERM})
    EXPECT_FALSE(http::is_local_shortage(sys(e))) << e;
  EXPECT_FALSE(http::is_local_shortage({}));
  EXPECT_FALSE(http::is_local_shortage(asio::error::operation_aborted));
}

// What a ShortageLog wrote.
struct Captured {
  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ~Captured() {
    std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

TEST(ShortageLog, TellsTheFirstFailureThenAtMostEveryTenSecondsThenTheEnd) {
  Captured out;
  http::ShortageLog log("worker 0: cannot accept", "clients wait", out.f);
  const auto t0 = Clock::now();
  log.succeeded(t0);  // nothing failed: nothing to say
  EXPECT_EQ(out.text(), "");
  for (int i = 0; i < 100; ++i) log.failed(sys(EMFILE), t0 + std::chrono::milliseconds(10 * i));
  EXPECT_EQ(out.text(), "weir: worker 0: cannot accept: Too many open files; clients wait\n");
  EXPECT_TRUE(log.failing());
  log.failed(sys(EMFILE), t0 + std::chrono::seconds(10));  // the 101st, 10 s after the first line
  EXPECT_EQ(out.text(),
            "weir: worker 0: cannot accept: Too many open files; clients wait\n"
            "weir: worker 0: cannot accept: still failing: Too many open files (100 times in the last 10 s)\n");
  log.failed(sys(EMFILE), t0 + std::chrono::seconds(11));
  log.succeeded(t0 + std::chrono::milliseconds(12'500));
  EXPECT_FALSE(log.failing());
  const std::string all = out.text();
  EXPECT_NE(all.find("weir: worker 0: cannot accept: works again, after 102 failures over 12.5 s\n"), std::string::npos)
      << all;
  // A new run within 10 s of the last failure line (a limit that flaps) is
  // not told apart, nor its end: its failures go into the next line.
  log.failed(sys(ENFILE), t0 + std::chrono::seconds(13));
  log.succeeded(t0 + std::chrono::seconds(14));
  log.failed(sys(ENFILE), t0 + std::chrono::seconds(15));
  EXPECT_EQ(out.text(), all);
  log.failed(sys(ENFILE), t0 + std::chrono::seconds(20));
  EXPECT_EQ(out.text(), all +
                            "weir: worker 0: cannot accept: Too many open files in system (3 times in the last 10 s); "
                            "clients wait\n");
  log.succeeded(t0 + std::chrono::seconds(21));
  EXPECT_NE(out.text().find("works again, after 2 failures over 6.0 s\n"), std::string::npos) << out.text();
}

TEST(ShortageLog, AFlappingLimitWritesAtMostTwoLinesPerTenSeconds) {
  Captured out;
  http::ShortageLog log("s", "e", out.f);
  const auto t0 = Clock::now();
  for (int ms = 0; ms < 60'000; ms += 10) {  // a minute of: fail, fail, accept
    const auto t = t0 + std::chrono::milliseconds(ms);
    if (ms % 30 == 20)
      log.succeeded(t);
    else
      log.failed(sys(EMFILE), t);
  }
  const std::string text = out.text();
  const auto lines = std::count(text.begin(), text.end(), '\n');
  EXPECT_LE(lines, 12) << text;
  EXPECT_GE(lines, 6) << text;
}

// Runs `f` with the process's soft descriptor limit at 3 (stdin, stdout and
// stderr open: every new descriptor fails with EMFILE), then puts it back.
// Not under the sanitizers: UBSan's vptr check probes a vtable's memory
// through a pipe (sanitizer_common's IsAccessibleMemoryRange), which cannot
// be opened at this limit, so it reports every dynamic type it has not cached
// yet as an invalid object (Asio's scheduler_task, a socket's shared_ptr):
// whether one is cached depends on which tests ran before in the process.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEIR_SANITIZED 1
#endif
#endif
#ifdef WEIR_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

template <class F>
void without_descriptors(F f) {
  rlimit was{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &was), 0);
  rlimit low = was;
  low.rlim_cur = 3;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  f();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &was), 0);
}

TEST(ProbeShortage, AProbeWeirCannotOpenIsNoVerdictOnTheEndpoint) {
  if (kSanitized) GTEST_SKIP() << "UBSan's vptr check needs descriptors (without_descriptors)";
  asio::io_context io;
  asio::ip::tcp::acceptor acc(io, {asio::ip::address_v4::loopback(), 0});  // a live endpoint
  boost::system::error_code shortage;
  const http::ProbeRequest req{.addr = acc.local_endpoint(),
                               .host_header = "127.0.0.1:1",
                               .path = "/health",
                               .timeout = std::chrono::milliseconds(2000),
                               .shortage = &shortage};
  std::optional<http::ProbeResult> result;
  without_descriptors([&] {
    test::spawn(io, http::probe_health(io.get_executor(), req), result);
    EXPECT_TRUE(test::run_until(io, [&] { return result.has_value(); }));
  });
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(*result, http::ProbeResult::local_shortage);
  EXPECT_EQ(http::shortage_of(shortage), http::Shortage::fds) << shortage.message();
}

TEST(ProbeShortage, AFetchWeirCannotOpenSaysSoNotTimedOut) {
  if (kSanitized) GTEST_SKIP() << "UBSan's vptr check needs descriptors (without_descriptors)";
  asio::io_context io;
  asio::ip::tcp::acceptor acc(io, {asio::ip::address_v4::loopback(), 0});
  std::string why;
  http::FetchFailure kind = http::FetchFailure::none;
  boost::system::error_code shortage;
  const http::ProbeRequest req{.addr = acc.local_endpoint(),
                               .host_header = "127.0.0.1:1",
                               .path = "/metrics",
                               .timeout = std::chrono::milliseconds(2000),
                               .failure = &why,
                               .failure_kind = &kind,
                               .shortage = &shortage};
  const std::size_t max_bytes = 1 << 20;
  std::string body;
  std::optional<int> status;
  without_descriptors([&] {
    test::spawn(io, http::fetch_text(io.get_executor(), req, body, max_bytes), status);
    EXPECT_TRUE(test::run_until(io, [&] { return status.has_value(); }));
  });
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 0);
  EXPECT_EQ(kind, http::FetchFailure::local_shortage);
  EXPECT_EQ(why, "cannot open a connection: Too many open files");
  EXPECT_EQ(http::shortage_of(shortage), http::Shortage::fds);
}

}  // namespace
