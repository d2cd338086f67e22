// AccessLogSink::reopen: log rotation swaps a new file in under the same
// descriptor number, with close-on-exec kept.
#include "core/access_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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
