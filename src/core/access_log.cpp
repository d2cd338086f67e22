#include "core/access_log.hpp"
#include "core/note.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace weir::core {

namespace {
constexpr std::size_t kFlushAt = 32u << 10;
constexpr std::size_t kPipeBuf = 4096;

// The log's open, at start-up and on SIGHUP's reopen (on the control
// thread, whose loop also serves signals and the admin API): it must not
// wait. A FIFO's open for writing waits for a reader (a log shipper
// restarting): O_NONBLOCK fails it at once (ENXIO) instead (a reopen keeps
// the old descriptor). A regular file's writes then block as before (the
// flag is cleared: it means nothing there, and a full disk is an error, not
// a wait); anything else (a FIFO, a terminal) keeps it: see non_blocking().
int open_file_now(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) return fd;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  }
  return fd;
}

// A log sink must never stop traffic: a write(2) to a pipe whose reader
// stopped reading (a log shipper paused or wedged) waits for it forever, on
// a worker's thread, holding the sink's mutex that the other workers wait
// on. So stdout, when it is anything but a regular file, is written through
// a descriptor of Weir's own with O_NONBLOCK: a full pipe answers EAGAIN at
// once and the lines that do not fit are dropped and counted. Setting the
// flag on stdout itself would change the open file description Weir shares
// with its parent and with its own stderr (2>&1): their writes would fail
// with EAGAIN too, so a new description of the same pipe or terminal is
// opened through /proc/self/fd/N (Linux). A socket (systemd's journal)
// cannot be opened that way: it keeps fd N, written with
// send(MSG_DONTWAIT), which is per call. Returns the descriptor to write to
// and whether it is Weir's own (to close); a regular file stays fd N (its
// writes do not wait on a reader, and a new description would have an
// offset of its own that overwrites stderr's lines after `>out 2>&1`).
std::pair<int, bool> non_blocking(int fd_n) {
  struct stat st {};
  if (::fstat(fd_n, &st) != 0 || S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode)) return {fd_n, false};
  // (O_NOCTTY: a terminal opened again must not become the controlling one of a session leader.)
  const int fd =
      ::open(fmt::format("/proc/self/fd/{}", fd_n).c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  // No /proc, or a pipe with no reader left (ENXIO: every write fails with EPIPE anyway): fd N as it is.
  if (fd < 0) return {fd_n, false};
  return {fd, true};
}

bool is_pipe(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
}

bool is_socket(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

// write(2), or on a socket send(2) that does not wait (see non_blocking()).
ssize_t write_now(int fd, const void* buf, std::size_t n) { return ::write(fd, buf, n); }
ssize_t send_now(int fd, const void* buf, std::size_t n) { return ::send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL); }

}  // namespace

void note_line(std::string_view line) noexcept {
  // Every note of the process (core/note.hpp) goes through one descriptor of its own, opened once.
  static const auto err = [] {
    const auto [fd, owned] = non_blocking(STDERR_FILENO);
    (void)owned;  // kept open for the process's life
    return std::pair{fd, is_socket(fd)};
  }();
  (void)(err.second ? send_now(err.first, line.data(), line.size()) : write_now(err.first, line.data(), line.size()));
}

std::shared_ptr<AccessLogSink> AccessLogSink::open(const std::string& where, std::string& error) {
  auto s = std::shared_ptr<AccessLogSink>(new AccessLogSink());
  if (where == "off" || where.empty()) return s;
  if (where == "-") {
    std::tie(s->fd_, s->owned_) = non_blocking(STDOUT_FILENO);
    s->socket_ = is_socket(s->fd_);
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
  if (try_reopen(error)) {
    __atomic_store_n(&reopen_pending_, false, __ATOMIC_RELAXED);
    return true;
  }
  __atomic_add_fetch(&reopen_failures_, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&reopen_pending_, true, __ATOMIC_RELAXED);
  return false;
}

bool AccessLogSink::retry_reopen(std::string& error) {
  if (!reopen_pending()) return true;
  if (!try_reopen(error)) return false;
  __atomic_store_n(&reopen_pending_, false, __ATOMIC_RELAXED);
  return true;
}

bool AccessLogSink::try_reopen(std::string& error) {
  if (path_.empty()) return true;
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
  if (fd_ < 0 || lines.empty()) return;
  std::string note;  // said on stderr once the mutex is released: a stderr that blocks holds only this worker
  {
    const std::lock_guard lock(mu_);
    write_locked(lines, note);
  }
  // The sink's own note, written as the log is (note_line): stderr is often the same stalled pipe as
  // stdout (`2>&1 | shipper`); dropped when it does not fit (the counters keep the count).
  if (!note.empty()) note_line(note);
}

void AccessLogSink::write_locked(std::string_view lines, std::string& note) {
  const WriteFn write = writer();
  if (torn_pending_ && !end_torn_line()) {
    note = count_lost(lines, errno);
    return;
  }
  std::size_t torn = 0;  // bytes of the current line already out: a short write's fragment
  while (!lines.empty()) {
    std::size_t n = lines.size();
    if (n > kPipeBuf && __atomic_load_n(&is_pipe_, __ATOMIC_RELAXED)) {
      // Cut at the last newline within PIPE_BUF so each write is atomic; a
      // single longer line goes out whole.
      const auto cut = lines.substr(0, kPipeBuf).rfind('\n');
      n = cut == std::string_view::npos ? lines.find('\n') + 1 : cut + 1;
      if (n == 0) n = lines.size();
    }
    const ssize_t w = write(fd_, lines.data(), n);
    if (w > 0) {
      const auto out = lines.substr(0, static_cast<std::size_t>(w));
      const auto nl = out.rfind('\n');
      torn = nl == std::string_view::npos ? torn + out.size() : out.size() - nl - 1;
      lines.remove_prefix(out.size());
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    // A full disk, a full pipe or a broken destination: the lines not
    // written are lost, never silently: counted
    // (weir_access_log_write_errors_total, and the lines in
    // weir_access_log_lines_lost_total, the torn one included) and said on
    // stderr, at most once per 10 s (the request log and the tracer do the
    // same). (A write of nothing, w == 0, is a failure too: retrying it
    // would spin.)
    const int err = w < 0 ? errno : 0;
    if (torn > 0) drop_fragment(torn);
    note = count_lost(lines, err);
    return;
  }
}

void AccessLogSink::drop_fragment(std::size_t torn) {
  // A duplicate pins the file the fragment went to: reopen() may swap
  // another in under fd_ at any moment (and with one swapped in before the
  // dup, the duplicate's offset is 0, as no write has gone through it yet:
  // the mutex keeps the other workers out).
  // Out of descriptors (EMFILE: a full disk and a descriptor shortage come
  // together under overload), fd_ itself: a file swapped in meanwhile has
  // its offset at 0, below the fragment's length, so nothing is cut there.
  const int pinned = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  const int fd = pinned >= 0 ? pinned : fd_;
  // With O_APPEND the offset after write(2) is the end of what it wrote;
  // no other worker has moved it since (the mutex). The file's size still
  // being that offset means nothing follows the fragment: cut it off. (A
  // size that differs: another process appended after it, whose own lines
  // follow, or someone truncated the file; either way nothing is ours to
  // cut.) The offset is set back too, for a destination without O_APPEND
  // (stdout redirected with >), whose next write would leave a hole.
  const off_t end = ::lseek(fd, 0, SEEK_CUR);
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  if (stated && S_ISREG(st.st_mode)) {
    const auto n = static_cast<off_t>(torn);
    const bool ours = end >= n && st.st_size == end;
    if (!ours || ::ftruncate(fd, end - n) == 0) {
      if (ours) ::lseek(fd, end - n, SEEK_SET);
      if (pinned >= 0) ::close(pinned);
      return;
    }
  }
  // A pipe, a terminal, or a file that could not be cut: the next write
  // ends the fragment's line first, so only it is lost.
  torn_pending_ = true;
  torn_dev_ = stated ? st.st_dev : 0;
  torn_ino_ = stated ? st.st_ino : 0;
  if (pinned >= 0) ::close(pinned);
}

bool AccessLogSink::end_torn_line() {
  struct stat st {};
  if (torn_ino_ != 0 && ::fstat(fd_, &st) == 0 && (st.st_dev != torn_dev_ || st.st_ino != torn_ino_)) {
    torn_pending_ = false;  // rotated since: the fragment ends the old file, the new one needs no newline
    return true;
  }
  const WriteFn write = writer();
  ssize_t w;
  while ((w = write(fd_, "\n", 1)) < 0 && errno == EINTR) {
  }
  if (w != 1) {
    if (w == 0) errno = EIO;
    return false;
  }
  torn_pending_ = false;
  return true;
}

AccessLogSink::WriteFn AccessLogSink::writer() const {
  if (write_) return write_;
  return socket_ ? &send_now : &write_now;
}

std::string AccessLogSink::count_lost(std::string_view rest, int err) {
  const auto lost = static_cast<std::uint64_t>(std::count(rest.begin(), rest.end(), '\n')) +
                    (rest.empty() || rest.back() == '\n' ? 0 : 1);
  __atomic_add_fetch(&write_errors_, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&lines_lost_, lost, __ATOMIC_RELAXED);
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::int64_t said = __atomic_load_n(&said_at_ns_, __ATOMIC_RELAXED);
  if ((said == 0 || now_ns - said >= 10'000'000'000) &&
      __atomic_compare_exchange_n(&said_at_ns_, &said, now_ns, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    // EAGAIN: only a pipe, FIFO, socket or terminal written without waiting answers it.
    if (err == EAGAIN || err == EWOULDBLOCK)
      return fmt::format(
          "weir: access log: the reader is not keeping up (its pipe is full): {} line(s) dropped, not waited for "
          "({} in all so far; said at most once per 10 s)\n",
          lost, lines_lost());
    return fmt::format("weir: access log: a write failed ({}): {} line(s) lost ({} in all so far)\n",
                       err ? std::strerror(err) : "nothing written", lost, lines_lost());
  }
  return {};
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
