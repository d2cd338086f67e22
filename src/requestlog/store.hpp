// The request-log store's writer: one thread that empties every worker's
// RecordQueue into the store (SQLite: one file, WAL mode, so readers run
// beside it, prepared statements in one transaction per batch; PostgreSQL:
// one COPY per batch) and applies retention. The request path only pushes
// into its worker's queue (requestlog/queue.hpp) and never waits: a full
// queue drops the record, a failed batch is dropped, and both are counted
// (weir_request_log_dropped_total) and said on stderr at most every 10 s.
// Captured bodies are redacted (requestlog/redact.hpp) and encoded here,
// on the writer's thread. The schema: requestlog/backend.hpp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/batch_thread.hpp"
#include "requestlog/backend.hpp"
#include "requestlog/config.hpp"
#include "requestlog/queue.hpp"

namespace weir::requestlog {

// Counters for /metrics; readable from any thread.
struct WriterStats {
  std::uint64_t written = 0;              // rows committed
  std::uint64_t dropped_queue_full = 0;   // records a worker found no room for
  std::uint64_t dropped_write_error = 0;  // records in a transaction that failed
  std::uint64_t dropped_shutdown = 0;     // records still queued when the shutdown drain ran out of time
  std::uint64_t errors = 0;               // failed opens, statements and commits
  std::uint64_t deleted = 0;              // rows removed by retention
  std::uint64_t queued = 0;               // records in the queues now
  std::uint64_t bodies_dropped = 0;       // records stored without their captured bodies (BodyBudget full)
  bool open = false;                      // the store is open for writing
};

class Writer {
 public:
  // One queue of config.queue records per worker. Nothing opens or starts yet.
  Writer(RequestLogConfig config, unsigned workers);
  ~Writer();  // stop(now) if still running
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  RecordQueue& queue(unsigned worker) { return *queues_[worker]; }
  BodyBudget& body_budget(unsigned worker) { return *budgets_[worker]; }
  const RequestLogConfig& config() const { return config_; }

  // Opens the store and starts the thread. A store that cannot be opened
  // (unwritable directory or file, a corrupt file) is not fatal: the error
  // goes to stderr and is counted, records wait in the queues (then drop)
  // and the thread tries again every second.
  void start();
  // After the workers stopped: writes what is queued until `deadline`,
  // counts the rest as dropped, closes the store and joins the thread.
  // False when the thread was still inside a store call 1 s past the
  // deadline (a PostgreSQL server that stopped answering: libpq waits
  // without a timeout of its own): it is left, and the Writer must then
  // never be destroyed.
  bool stop(std::chrono::steady_clock::time_point deadline);

  WriterStats stats() const;

  // --- the thread's steps, public for tests; call them only while the
  // thread is not running ---
  // Opens the store (SQLite: the file in WAL mode; PostgreSQL: a
  // connection), creates or upgrades the schema. False with `error` set (and counted).
  bool open_store(std::string& error);
  // One transaction (SQLite) or COPY (PostgreSQL) of up to config.batch
  // records taken from the queues in turn. Returns the records taken
  // (written, or dropped when it failed).
  std::size_t write_batch();
  // Deletes rows with ts_us < now_us - max_age and all but the newest
  // max_rows (chunks of 10,000 rows, each its own transaction).
  void apply_retention(std::int64_t now_us);
  std::uint64_t transactions() const { return transactions_; }

 private:
  // One turn of the writer thread: a batch (or a reopen attempt), retention when due, the stderr report.
  std::size_t step();
  // After stop(): writes what is queued until `deadline`, counts the rest as dropped.
  void drain(std::chrono::steady_clock::time_point deadline);
  void count_error(const std::string& what);
  // The stderr lines (drops, errors since the last), at most every 10 s unless `now_anyway`.
  void report(bool now_anyway = false);
  // Why a full queue dropped records, for report(): not open, the last write failed (its error), or slow.
  std::string queue_full_reason() const;
  // Says last_error_ on stderr now (core::note), and counts it as said (report() does not say it again).
  void say_now();
  // `r`'s captured bodies as the `bodies` column's JSON (redacted), into bodies_; empty = none.
  std::string_view bodies_json(Record& r);

  RequestLogConfig config_;
  std::vector<std::unique_ptr<RecordQueue>> queues_;
  std::vector<std::unique_ptr<BodyBudget>> budgets_;  // one per queue
  std::unique_ptr<StoreBackend> store_;
  std::string scratch_, bodies_, body_text_;  // the writer thread's reused buffers
  std::size_t next_queue_ = 0;
  std::uint64_t transactions_ = 0;

  std::atomic<std::uint64_t> written_{0}, dropped_write_{0}, dropped_shutdown_{0}, errors_{0}, deleted_{0};
  std::atomic<bool> open_{false};
  // Rate-limited reporting (writer thread).
  std::chrono::steady_clock::time_point last_report_{};
  std::uint64_t reported_queue_full_ = 0;   // the drops said so far, by reason
  std::uint64_t reported_write_error_ = 0;  // (shutdown's are said by drain())
  std::uint64_t reported_errors_ = 0;
  std::string last_error_;
  bool last_write_failed_ = false;  // the last batch's BEGIN, INSERT or COMMIT failed (writer thread)

  std::chrono::steady_clock::time_point next_retention_{}, next_open_{};  // writer thread
  core::BatchThread loop_;                                                // last: joined before the members it uses go
};

// True when `s` is well-formed UTF-8 (Unicode §3.9, Table 3-7).
bool valid_utf8(std::string_view s) noexcept;
// `s` itself when well-formed UTF-8, else a copy in `out` with each maximal
// ill-formed subsequence replaced by one U+FFFD (core::append_valid_utf8:
// the access log's rule, so a column equals the line's field).
std::string_view make_valid(std::string_view s, std::string& out);

}  // namespace weir::requestlog
