#include "core/access_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace weir::core {

namespace {
constexpr std::size_t kFlushAt = 32u << 10;
constexpr std::size_t kPipeBuf = 4096;

// The log's open, at start-up and on SIGHUP's reopen (on the control
// thread, whose loop also serves signals and the admin API): it must not
// wait. A FIFO's open for writing waits for a reader (a log shipper
// restarting): O_NONBLOCK fails it at once (ENXIO) instead (a reopen keeps
// the old descriptor). Writes then block as before (the flag is cleared).
int open_file_now(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) return fd;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

bool is_pipe(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
}
}  // namespace

std::shared_ptr<AccessLogSink> AccessLogSink::open(const std::string& where, std::string& error) {
  auto s = std::shared_ptr<AccessLogSink>(new AccessLogSink());
  if (where == "off" || where.empty()) return s;
  if (where == "-") {
    s->fd_ = STDOUT_FILENO;
  } else {
    // (Not waiting either: a FIFO with no reader would hold start-up before
    // its signal handlers, silent, until one came.)
    s->fd_ = open_file_now(where);
    if (s->fd_ < 0) {
      error = errno == ENXIO ? fmt::format("cannot open access log {}: a pipe with no reader", where)
                             : fmt::format("cannot open access log {}: {}", where, std::strerror(errno));
      return nullptr;
    }
    s->owned_ = true;
    s->path_ = where;
  }
  s->is_pipe_ = is_pipe(s->fd_);
  return s;
}

bool AccessLogSink::reopen(std::string& error) {
  if (!owned_) return true;
  const int fd = open_file_now(path_);
  if (fd < 0) {
    error = errno == ENXIO ? fmt::format("cannot reopen access log {}: a pipe with no reader", path_)
                           : fmt::format("cannot reopen access log {}: {}", path_, std::strerror(errno));
    return false;
  }
  const bool pipe = is_pipe(fd);
  // dup3 keeps O_CLOEXEC on fd_ (dup2 would clear it).
  int r;
  while ((r = ::dup3(fd, fd_, O_CLOEXEC)) < 0 && errno == EINTR) {
  }
  const int dup_errno = errno;
  ::close(fd);
  if (r < 0) {
    error = fmt::format("cannot reopen access log {}: dup3: {}", path_, std::strerror(dup_errno));
    return false;
  }
  __atomic_store_n(&is_pipe_, pipe, __ATOMIC_RELAXED);
  return true;
}

AccessLogSink::~AccessLogSink() {
  if (owned_ && fd_ >= 0) ::close(fd_);
}

void AccessLogSink::write_lines(std::string_view lines) {
  if (fd_ < 0) return;
  while (!lines.empty()) {
    std::size_t n = lines.size();
    if (n > kPipeBuf && __atomic_load_n(&is_pipe_, __ATOMIC_RELAXED)) {
      // Cut at the last newline within PIPE_BUF so each write is atomic; a
      // single longer line goes out whole.
      const auto cut = lines.substr(0, kPipeBuf).rfind('\n');
      n = cut == std::string_view::npos ? lines.find('\n') + 1 : cut + 1;
      if (n == 0) n = lines.size();
    }
    const ssize_t w = ::write(fd_, lines.data(), n);
    if (w < 0) {
      if (errno == EINTR) continue;
      // A full pipe or a broken destination: the lines not written are lost,
      // never silently: counted (weir_access_log_write_errors_total, and the
      // lines in weir_access_log_lines_lost_total) and said on stderr, at
      // most once per 10 s (the request log and the tracer do the same).
      const int why = errno;
      const auto lost = static_cast<std::uint64_t>(std::count(lines.begin(), lines.end(), '\n')) +
                        (lines.empty() || lines.back() == '\n' ? 0 : 1);
      __atomic_add_fetch(&write_errors_, 1, __ATOMIC_RELAXED);
      __atomic_add_fetch(&lines_lost_, lost, __ATOMIC_RELAXED);
      const std::int64_t now_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count();
      std::int64_t said = __atomic_load_n(&said_at_ns_, __ATOMIC_RELAXED);
      if ((said == 0 || now_ns - said >= 10'000'000'000) &&
          __atomic_compare_exchange_n(&said_at_ns_, &said, now_ns, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        fmt::print(stderr, "weir: access log: a write failed ({}): {} line(s) lost ({} in all so far)\n",
                   std::strerror(why), lost, lines_lost());
      return;
    }
    lines.remove_prefix(static_cast<std::size_t>(w));
  }
}

AccessLog::AccessLog(std::shared_ptr<AccessLogSink> sink) : sink_(std::move(sink)) { buf_.reserve(kFlushAt + 4096); }

AccessLog::~AccessLog() { flush(); }

void AccessLog::end_line() {
  buf_ += '\n';
  if (buf_.size() >= kFlushAt) flush();
}

void AccessLog::flush() {
  if (buf_.empty() || !sink_) return;
  sink_->write_lines(buf_);
  buf_.clear();
}

}  // namespace weir::core
