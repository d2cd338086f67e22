// The access log: one JSON object per line per request.
//
// Each worker appends lines to its own buffer (no lock, no allocation once
// the buffer has grown) and writes the buffer out with write(2) when it
// passes 32 KiB or on the worker's periodic flush tick. All workers share one
// file descriptor opened with O_APPEND; each write(2) carries whole lines and
// at most PIPE_BUF (4096) bytes when the destination is a pipe, so lines from
// different workers never interleave. Log rotation swaps a new file in under
// the same descriptor number (AccessLogSink::reopen).
//
// The file holds whole lines only: a write cut short (a full disk) leaves the
// start of a line with no newline, which the next line would be glued to;
// the sink takes that fragment off again (or, where it cannot, starts the
// next write on a new line), so a failed write loses whole lines, counted.
//
// A log sink never stops traffic: a pipe, FIFO, socket or terminal is
// written without waiting (O_NONBLOCK on a descriptor of Weir's own, or
// send(MSG_DONTWAIT)), so a reader that stops reading costs the lines that
// do not fit in its pipe (dropped and counted), never a worker, the mutex
// the workers share, or the drain. A regular file is written as before.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace weir::core {

// The shared destination: stdout, a file, or nothing.
class AccessLogSink {
 public:
  // "-" = stdout, "off" = disabled, else a path opened for appending.
  // Returns nullptr and sets `error` if the file cannot be opened. stdout
  // that is not a regular file is written through a new non-blocking
  // description of it (/proc/self/fd/1; a socket: send(MSG_DONTWAIT)), so
  // fd 1's own flags, shared with the parent and with stderr, stay as
  // they were.
  static std::shared_ptr<AccessLogSink> open(const std::string& where, std::string& error);
  ~AccessLogSink();

  bool enabled() const { return fd_ >= 0; }
  // Writes whole lines (each ends in '\n'); a short write is retried, errors
  // are counted. A failed write that had put out part of a line takes that
  // part off the file (ftruncate(2) back to the line's start) when nothing
  // follows it there; otherwise (a pipe, another process appended after it)
  // the next write starts with '\n', so the fragment is one bad line and the
  // lines after it are whole. Workers call it concurrently: it holds a mutex
  // across its writes (the kernel serializes appends to one file anyway), so
  // no other worker's write lands between a fragment and its repair. It
  // never waits on a reader, so no worker waits on that mutex behind one: a
  // full pipe (EAGAIN) drops the lines that did not fit, counted in
  // lines_lost() and said on stderr at most once per 10 s (after the mutex
  // is released, and without waiting either: stderr is often the same pipe).
  void write_lines(std::string_view lines);
  std::uint64_t write_errors() const { return __atomic_load_n(&write_errors_, __ATOMIC_RELAXED); }
  // Lines a failed write dropped (whole or in part): what an operator lost.
  std::uint64_t lines_lost() const { return __atomic_load_n(&lines_lost_, __ATOMIC_RELAXED); }

  // Log rotation (SIGHUP, after `mv access.log access.log.1`): opens the
  // path again, creating it, and puts the new file under the same descriptor
  // number with dup3(2), which swaps it atomically: a worker's write(2) goes
  // wholly to the old file or wholly to the new one, and no lock is needed.
  // Safe to call from any thread while workers write. Returns false with
  // `error` set if the path cannot be opened (the old file stays in use).
  // stdout and "off": nothing to reopen, returns true. It takes no lock (the
  // control thread must not wait behind a worker's write to a stalled pipe).
  // A failure is counted in reopen_failures() and leaves reopen_pending()
  // true until a reopen or retry_reopen() succeeds.
  bool reopen(std::string& error);
  // After a failed reopen(): tries it again (the control thread, every
  // second), without counting another failure. True once the new file is in
  // place, or when none is pending.
  bool retry_reopen(std::string& error);
  // Reopens (SIGHUP, SIGUSR1) that failed (weir_access_log_reopen_failures_total).
  std::uint64_t reopen_failures() const { return __atomic_load_n(&reopen_failures_, __ATOMIC_RELAXED); }
  // True while a failed reopen leaves the lines going to the old (rotated)
  // file (weir_access_log_reopen_pending).
  bool reopen_pending() const { return __atomic_load_n(&reopen_pending_, __ATOMIC_RELAXED); }
  // The file's path; empty for stdout and "off".
  const std::string& path() const { return path_; }

  // For tests: a stand-in for write(2), to make a write short or fail.
  using WriteFn = ssize_t (*)(int fd, const void* buf, std::size_t n);
  void set_write_for_test(WriteFn write) { write_ = write; }

 private:
  // reopen() without the counting.
  bool try_reopen(std::string& error);
  // write_lines() under mu_; sets `note` to a line for stderr.
  void write_locked(std::string_view lines, std::string& note);
  // The write function: the test's stand-in, send(MSG_DONTWAIT) on a socket, else write(2).
  WriteFn writer() const;
  // After a failed write that left `torn` bytes of a line at the end of the
  // destination: takes them off, or marks the next write to start a line.
  void drop_fragment(std::size_t torn);
  // Before writing after drop_fragment() could not take a fragment off:
  // ends that line with '\n' (not when the destination is another file
  // now, after a rotation). False if the newline could not be written.
  bool end_torn_line();
  // Counts the lines of `rest` (the last one may lack its '\n') as lost;
  // returns the line to say on stderr (at most one per 10 s, else empty).
  // `err`: the write's errno, 0 for a write of nothing.
  std::string count_lost(std::string_view rest, int err);

  int fd_ = -1;
  bool owned_ = false;
  bool is_pipe_ = false;  // atomic loads and stores: reopen() may change it
  bool socket_ = false;   // stdout is a socket: written with send(MSG_DONTWAIT)
  std::string path_;
  std::uint64_t write_errors_ = 0;     // bumped atomically: workers share the sink
  std::uint64_t lines_lost_ = 0;       // (as write_errors_)
  std::uint64_t reopen_failures_ = 0;  // (as write_errors_)
  bool reopen_pending_ = false;        // atomic loads and stores
  std::int64_t said_at_ns_ = 0;        // the last stderr line about a failed write (at most one per 10 s)
  WriteFn write_ = nullptr;            // write(2) unless a test put a stand-in
  std::mutex mu_;                      // held across write_lines(): a torn line is repaired before others write
  // Under mu_: a fragment drop_fragment() could not take off ends the
  // destination (dev, ino: the file it went to), so the next write must
  // begin with '\n'.
  bool torn_pending_ = false;
  dev_t torn_dev_ = 0;
  ino_t torn_ino_ = 0;
};

// A worker's line buffer.
class AccessLog {
 public:
  explicit AccessLog(std::shared_ptr<AccessLogSink> sink);
  ~AccessLog();

  bool enabled() const { return sink_ && sink_->enabled(); }
  // The buffer to append one line to (without the newline); then call end_line().
  std::string& begin_line() { return buf_; }
  void end_line();
  // Writes out what is buffered.
  void flush();
  // True while lines wait for flush().
  bool pending() const { return !buf_.empty(); }

 private:
  std::shared_ptr<AccessLogSink> sink_;
  std::string buf_;
};

}  // namespace weir::core
