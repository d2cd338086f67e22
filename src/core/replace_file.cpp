#include "core/replace_file.hpp"
#include "core/note.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace weir::core {

tl::expected<void, std::string> replace_file(const std::string& path, std::string_view bytes, mode_t mode) {
  const std::string tmp = path + ".tmp";
  // A new file, never one found there: a symbolic link planted at P.tmp
  // (O_NOFOLLOW, and unlink removes the link, not its target) or a file
  // another process holds open would otherwise get the bytes, or keep its
  // own mode. A stale P.tmp (a crash between open and rename) is removed
  // first; one that comes back in between makes O_EXCL fail: nothing written.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    return tl::unexpected(fmt::format("cannot remove the stale {}: {}", tmp, std::strerror(errno)));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return tl::unexpected(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
  // Every failure from here on closes the descriptor and removes P.tmp: a
  // caller that saves again (the admin API, after a full disk clears) finds
  // no descriptor leaked and no half-written file left beside P.
  auto fail = [&](int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return tl::unexpected(fmt::format("cannot write {}: {}", tmp, std::strerror(err)));
  };
  std::size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(n == 0 ? EIO : errno);
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) return fail(errno);
  // (A failed close is not retried: Linux releases the descriptor whatever it returns.)
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return tl::unexpected(fmt::format("cannot write {}: {}", tmp, std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return tl::unexpected(fmt::format("cannot replace {}: {}", path, std::strerror(err)));
  }
  // The rename is durable only once the directory is (a power loss could
  // otherwise bring the old file back after the caller said saved). The new
  // file is in place by now: a failure here is reported, not undone.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0)
    weir::core::note("weir: cannot sync the directory {} after writing {}: {}\n", dir, path, std::strerror(errno));
  if (dfd >= 0) ::close(dfd);
  return {};
}

}  // namespace weir::core
