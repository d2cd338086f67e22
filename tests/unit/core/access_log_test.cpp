// AccessLogSink::reopen: log rotation swaps a new file in under the same
// descriptor number, with close-on-exec kept. AccessLogSink::write_lines: a
// write cut short (a full disk) leaves whole lines only.
#include "core/access_log.hpp"
#include <sys/resource.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

using weir::core::AccessLogSink;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The descriptor of this process open on `p`, or -1.
int fd_open_on(const fs::path& p) {
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec) == p) return std::stoi(e.path().filename().string());
  }
  return -1;
}

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

fs::path temp_dir() {
  char tmpl[] = "/tmp/weir-access-log-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? fs::path(d) : fs::path("/tmp");
}

}  // namespace

TEST(AccessLogSink, ReopenAfterRenameWritesToANewFile) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  std::string err;
  auto sink = AccessLogSink::open(path.string(), err);
  ASSERT_TRUE(sink) << err;
  EXPECT_EQ(sink->path(), path.string());
  sink->write_lines("one\n");
  fs::rename(path, dir / "access.log.1");
  sink->write_lines("two\n");  // still the renamed file, until reopened
  ASSERT_TRUE(sink->reopen(err)) << err;
  sink->write_lines("three\n");
  EXPECT_EQ(slurp(dir / "access.log.1"), "one\ntwo\n");
  EXPECT_EQ(slurp(path), "three\n");
  ASSERT_TRUE(sink->reopen(err)) << err;  // nothing renamed: appends to the same file
  sink->write_lines("four\n");
  EXPECT_EQ(slurp(path), "three\nfour\n");
  EXPECT_EQ(sink->write_errors(), 0u);
  fs::remove_all(dir);
}

TEST(AccessLogSink, ReopenKeepsTheDescriptorNumberAndCloseOnExec) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  std::string err;
  auto sink = AccessLogSink::open(path.string(), err);
  ASSERT_TRUE(sink) << err;
  const int fd = fd_open_on(path);
  ASSERT_GE(fd, 0);
  const auto fds_before = open_fds();
  fs::rename(path, dir / "old.log");
  ASSERT_TRUE(sink->reopen(err)) << err;
  EXPECT_EQ(fd_open_on(path), fd);  // the same number now names the new file
  EXPECT_EQ(::fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(open_fds(), fds_before);  // nothing leaked
  fs::remove_all(dir);
}

TEST(AccessLogSink, ReopenFailureKeepsTheOldFile) {
  const auto dir = temp_dir();
  const auto path = dir / "sub" / "access.log";
  fs::create_directory(dir / "sub");
  std::string err;
  auto sink = AccessLogSink::open(path.string(), err);
  ASSERT_TRUE(sink) << err;
  fs::rename(dir / "sub", dir / "moved");  // the directory is gone: the path cannot be opened
  EXPECT_FALSE(sink->reopen(err));
  EXPECT_NE(err.find(path.string()), std::string::npos) << err;
  sink->write_lines("still here\n");
  EXPECT_EQ(slurp(dir / "moved" / "access.log"), "still here\n");
  fs::remove_all(dir);
}

TEST(AccessLogSink, ReopenOfStdoutAndOffIsANoOp) {
  std::string err;
  for (const char* where : {"-", "off"}) {
    auto sink = AccessLogSink::open(where, err);
    ASSERT_TRUE(sink);
    EXPECT_TRUE(sink->path().empty());
    EXPECT_TRUE(sink->reopen(err));
  }
}

// --- a write cut short: a stand-in for write(2) that writes at most `budget`
// bytes (then fails with `fail_errno`), and at most `per_call` a call.
namespace {

struct ShortWrites {
  std::size_t budget = SIZE_MAX;
  std::size_t per_call = SIZE_MAX;
  int fail_errno = ENOSPC;
  std::function<void()> before_failing;  // runs once, just before the first failure
  std::size_t calls = 0;
};
ShortWrites g_short;

ssize_t short_write(int fd, const void* buf, std::size_t n) {
  ++g_short.calls;
  n = std::min({n, g_short.budget, g_short.per_call});
  if (n == 0) {
    if (g_short.before_failing) std::exchange(g_short.before_failing, nullptr)();
    errno = g_short.fail_errno;
    return -1;
  }
  const ssize_t w = ::write(fd, buf, n);
  if (w > 0) g_short.budget -= static_cast<std::size_t>(w);
  return w;
}

std::shared_ptr<AccessLogSink> short_sink(const fs::path& path, ShortWrites s) {
  g_short = std::move(s);
  std::string err;
  auto sink = AccessLogSink::open(path.string(), err);
  EXPECT_TRUE(sink) << err;
  if (sink) sink->set_write_for_test(&short_write);
  return sink;
}

}  // namespace

TEST(AccessLogSink, AWriteCutShortTakesTheTornLineOff) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  auto sink = short_sink(path, {});
  sink->write_lines("one\ntwo\n");
  g_short.budget = 8;  // "three\nfo", then ENOSPC
  sink->write_lines("three\nfour\nfive\n");
  EXPECT_EQ(slurp(path), "one\ntwo\nthree\n");
  EXPECT_EQ(sink->write_errors(), 1u);
  EXPECT_EQ(sink->lines_lost(), 2u);  // four (torn) and five
  g_short.budget = SIZE_MAX;          // the disk freed
  sink->write_lines("six\n");
  EXPECT_EQ(slurp(path), "one\ntwo\nthree\nsix\n");
  fs::remove_all(dir);
}

// A full disk and a descriptor shortage come together under overload: the
// duplicate that pins the file cannot be made, and the fragment is cut
// through the log's own descriptor (it was left in the file, and the next
// line written after it).
TEST(AccessLogSink, OutOfDescriptorsATornLineIsStillTakenOff) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  auto sink = short_sink(path, {});
  sink->write_lines("one\n");
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  g_short.budget = 2;  // "tw", then ENOSPC
  g_short.before_failing = [&] {
    const int lowest_free = ::dup(0);
    ::close(lowest_free);
    rlimit none = old;
    none.rlim_cur = static_cast<rlim_t>(lowest_free);  // no descriptor can be made now
    ::setrlimit(RLIMIT_NOFILE, &none);
  };
  sink->write_lines("two\nthree\n");
  ::setrlimit(RLIMIT_NOFILE, &old);
  EXPECT_EQ(slurp(path), "one\n");
  EXPECT_EQ(sink->lines_lost(), 2u);
  g_short.budget = SIZE_MAX;
  sink->write_lines("four\n");
  EXPECT_EQ(slurp(path), "one\nfour\n");
  fs::remove_all(dir);
}

TEST(AccessLogSink, ALineTornOverSeveralShortWritesIsTakenOffWhole) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  auto sink = short_sink(path, {.budget = 13, .per_call = 3});  // "abc\ndefghijkl" in 3-byte writes
  sink->write_lines("abc\ndefghijklmnop\nq\n");
  EXPECT_EQ(slurp(path), "abc\n");
  EXPECT_EQ(sink->lines_lost(), 2u);
  EXPECT_GT(g_short.calls, 5u);
  fs::remove_all(dir);
}

TEST(AccessLogSink, AWriteThatFailsOnALineBoundaryCutsNothing) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  auto sink = short_sink(path, {.budget = 4});  // "abc\n" exactly
  sink->write_lines("abc\ndef\n");
  EXPECT_EQ(slurp(path), "abc\n");
  EXPECT_EQ(sink->lines_lost(), 1u);
  fs::remove_all(dir);
}

TEST(AccessLogSink, AWriteOfNothingIsAFailureNotASpin) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  std::string err;
  auto sink = AccessLogSink::open(path.string(), err);
  ASSERT_TRUE(sink) << err;
  sink->set_write_for_test([](int, const void*, std::size_t) -> ssize_t { return 0; });
  sink->write_lines("abc\ndef\n");
  EXPECT_EQ(sink->write_errors(), 1u);
  EXPECT_EQ(sink->lines_lost(), 2u);
  fs::remove_all(dir);
}

TEST(AccessLogSink, WhatAnotherProcessAppendedAfterAFragmentIsNotCut) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  auto sink = short_sink(path, {.budget = 6});
  g_short.before_failing = [&] {
    const int other = ::open(path.c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(other, 0);
    ASSERT_EQ(::write(other, "theirs\n", 7), 7);
    ::close(other);
  };
  sink->write_lines("abc\ndefgh\n");  // "abc\nde", then theirs, then ENOSPC
  EXPECT_EQ(slurp(path), "abc\ndetheirs\n");
  EXPECT_EQ(sink->lines_lost(), 1u);
  g_short.budget = SIZE_MAX;
  sink->write_lines("ijk\n");  // their line ended the fragment's: no empty line
  EXPECT_EQ(slurp(path), "abc\ndetheirs\nijk\n");
  fs::remove_all(dir);
}

TEST(AccessLogSink, ARotationBetweenATornWriteAndItsRepairLeavesTheNewFileAlone) {
  const auto dir = temp_dir();
  const auto path = dir / "access.log";
  auto sink = short_sink(path, {.budget = 6});
  g_short.before_failing = [&] {
    fs::rename(path, dir / "access.log.1");
    std::string err;
    ASSERT_TRUE(sink->reopen(err)) << err;
  };
  sink->write_lines("abc\ndefgh\n");
  EXPECT_EQ(slurp(path), "");  // not cut, not extended with zeros
  EXPECT_EQ(fs::file_size(path), 0u);
  EXPECT_EQ(sink->lines_lost(), 1u);
  g_short.budget = SIZE_MAX;
  sink->write_lines("ijk\n");
  EXPECT_EQ(slurp(path), "ijk\n");  // no newline for a fragment the new file never had
  fs::remove_all(dir);
}

TEST(AccessLogSink, APipeCannotBeCutSoTheNextWriteStartsALine) {
  const auto dir = temp_dir();
  const auto path = dir / "access.fifo";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  auto sink = short_sink(path, {.budget = 6, .fail_errno = EAGAIN});
  sink->write_lines("abc\ndefgh\n");  // "abc\nde" reaches the reader
  EXPECT_EQ(sink->lines_lost(), 1u);
  g_short.budget = SIZE_MAX;
  sink->write_lines("ijk\n");
  char buf[64];
  const ssize_t n = ::read(reader, buf, sizeof buf);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<std::size_t>(n)), "abc\nde\nijk\n");
  ::close(reader);
  sink.reset();
  fs::remove_all(dir);
}

TEST(AccessLogSink, ANewlineThatCannotBeWrittenLosesTheBatchNotItsFirstLine) {
  const auto dir = temp_dir();
  const auto path = dir / "access.fifo";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  auto sink = short_sink(path, {.budget = 6, .fail_errno = EAGAIN});
  sink->write_lines("abc\ndefgh\n");
  sink->write_lines("ijk\nlmn\n");  // still failing: the newline too
  EXPECT_EQ(sink->write_errors(), 2u);
  EXPECT_EQ(sink->lines_lost(), 3u);
  g_short.budget = SIZE_MAX;
  sink->write_lines("opq\n");
  char buf[64];
  const ssize_t n = ::read(reader, buf, sizeof buf);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<std::size_t>(n)), "abc\nde\nopq\n");
  ::close(reader);
  sink.reset();
  fs::remove_all(dir);
}

// --- a reader that stops reading: the sink drops what does not fit and never
// waits (a worker blocked in write(2) stopped traffic and the drain).
namespace {

// Runs `write` on a thread; if it has not returned after 30 s (it waits on
// the reader), reads `reader` dry until it does, so the test fails instead
// of hanging. True if it returned by itself.
bool returns_without_a_reader(int reader, const std::function<void()>& write) {
  std::atomic<bool> done{false};
  std::thread t([&] {
    write();
    done = true;
  });
  for (int i = 0; i < 3000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool by_itself = done;
  char buf[65536];
  while (!done) {
    if (::read(reader, buf, sizeof buf) <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  t.join();
  return by_itself;
}

// 256 KiB of 100-byte lines, in 32 KiB batches (a worker's buffer): four
// times a pipe's default capacity.
void write_a_lot(AccessLogSink& sink) {
  const std::string line(99, 'x');
  std::string batch;
  for (int i = 0; i < 328; ++i) batch += line + '\n';
  for (int i = 0; i < 8; ++i) sink.write_lines(batch);
}

std::string read_all(int reader) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(reader, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

}  // namespace

TEST(AccessLogSink, AFifoWhoseReaderStopsReadingDropsLinesInsteadOfWaiting) {
  const auto dir = temp_dir();
  const auto path = dir / "access.fifo";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  std::string err;
  auto sink = AccessLogSink::open(path.string(), err);
  ASSERT_TRUE(sink) << err;
  EXPECT_TRUE(returns_without_a_reader(reader, [&] { write_a_lot(*sink); }));
  EXPECT_GT(sink->lines_lost(), 0u);
  EXPECT_GT(sink->write_errors(), 0u);
  // What got through is whole lines; once the reader reads again, lines flow again.
  const auto first = read_all(reader);
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first.back(), '\n');
  const auto lost = sink->lines_lost();
  sink->write_lines("again\n");
  EXPECT_EQ(read_all(reader), "again\n");
  EXPECT_EQ(sink->lines_lost(), lost);
  ::close(reader);
  sink.reset();
  fs::remove_all(dir);
}

TEST(AccessLogSink, StdoutOnAPipeIsWrittenWithoutWaitingAndItsOwnFlagsStay) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  ASSERT_GE(saved, 0);
  ::dup2(p[1], STDOUT_FILENO);
  ::close(p[1]);
  ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
  std::string err;
  auto sink = AccessLogSink::open("-", err);
  const int stdout_flags = ::fcntl(STDOUT_FILENO, F_GETFL);
  const bool by_itself = sink && returns_without_a_reader(p[0], [&] { write_a_lot(*sink); });
  const auto lost = sink ? sink->lines_lost() : 0;
  const bool opened = sink != nullptr;
  sink.reset();
  ::dup2(saved, STDOUT_FILENO);  // (before any assertion: gtest prints to stdout)
  ::close(saved);
  ASSERT_TRUE(opened) << err;
  EXPECT_TRUE(by_itself);
  EXPECT_GT(lost, 0u);
  // The description Weir shares with its parent (and stderr after 2>&1) does not turn non-blocking.
  EXPECT_EQ(stdout_flags & O_NONBLOCK, 0);
  EXPECT_FALSE(read_all(p[0]).empty());
  ::close(p[0]);
}

TEST(AccessLogSink, AFailedReopenIsCountedAndRetriedUntilItOpens) {
  const auto dir = temp_dir();
  const auto path = dir / "sub" / "access.log";
  fs::create_directory(dir / "sub");
  std::string err;
  auto sink = AccessLogSink::open(path.string(), err);
  ASSERT_TRUE(sink) << err;
  EXPECT_FALSE(sink->reopen_pending());
  fs::rename(dir / "sub", dir / "moved");
  EXPECT_FALSE(sink->reopen(err));
  EXPECT_EQ(sink->reopen_failures(), 1u);
  EXPECT_TRUE(sink->reopen_pending());
  EXPECT_FALSE(sink->retry_reopen(err));  // a retry that fails is not another failed reopen
  EXPECT_EQ(sink->reopen_failures(), 1u);
  sink->write_lines("old\n");
  fs::create_directory(dir / "sub");
  EXPECT_TRUE(sink->retry_reopen(err)) << err;
  EXPECT_FALSE(sink->reopen_pending());
  sink->write_lines("new\n");
  EXPECT_EQ(slurp(dir / "moved" / "access.log"), "old\n");
  EXPECT_EQ(slurp(path), "new\n");
  EXPECT_TRUE(sink->retry_reopen(err));  // none pending: nothing to do
  EXPECT_EQ(slurp(path), "new\n");
  fs::remove_all(dir);
}
