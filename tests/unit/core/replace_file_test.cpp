// replace_file's failure paths: a write or an fsync that fails leaves
// neither a descriptor open nor P.tmp behind, and P keeps its old bytes.
// The failures are real where they can be (RLIMIT_FSIZE makes write fail
// with EFBIG); fsync's, which no ordinary file system gives on demand, is
// injected: this binary's own fsync() wraps libc's and fails once when asked.
#include "core/replace_file.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace {

int fail_next_fsync = 0;  // the errno the next fsync() returns with; 0: libc's fsync
int failed_fsync_fd = -1;

}  // namespace

// Interposes libc's fsync for the whole binary (an executable's symbol wins); passes through unless armed.
extern "C" int fsync(int fd) {
  if (fail_next_fsync != 0) {
    errno = fail_next_fsync;
    fail_next_fsync = 0;
    failed_fsync_fd = fd;
    return -1;
  }
  using Fn = int (*)(int);
  static const auto real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "fsync"));
  return real(fd);
}

namespace {

namespace fs = std::filesystem;

struct ReplaceFileDir {
  fs::path dir;
  ReplaceFileDir() {
    char tmpl[] = "/tmp/weir-replace-file-XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~ReplaceFileDir() { fs::remove_all(dir); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(ReplaceFile, FailedFsyncClosesTheDescriptorAndRemovesTheTemporaryFile) {
  ReplaceFileDir d;
  const std::string path = (d.dir / "keys.json").string();
  ASSERT_TRUE(weir::core::replace_file(path, "old", 0600));
  fail_next_fsync = EIO;
  failed_fsync_fd = -1;
  auto r = weir::core::replace_file(path, "new bytes", 0600);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("cannot write " + path + ".tmp"), std::string::npos) << r.error();
  ASSERT_GE(failed_fsync_fd, 0);
  // The descriptor fsync failed on is closed (no other open happened in between to reuse its number).
  errno = 0;
  EXPECT_EQ(::fcntl(failed_fsync_fd, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(slurp(path), "old");
  // And the next save works.
  ASSERT_TRUE(weir::core::replace_file(path, "newer", 0600));
  EXPECT_EQ(slurp(path), "newer");
}

TEST(ReplaceFile, FailedWriteRemovesTheTemporaryFile) {
  ReplaceFileDir d;
  const std::string path = (d.dir / "keys.json").string();
  ASSERT_TRUE(weir::core::replace_file(path, "old", 0600));
  // A file size limit below the bytes: write() fails with EFBIG (SIGXFSZ ignored, as it would kill the process).
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* const old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto r = weir::core::replace_file(path, std::string(64, 'x'), 0600);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("cannot write " + path + ".tmp"), std::string::npos) << r.error();
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(slurp(path), "old");
}
