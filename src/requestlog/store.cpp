#include "requestlog/store.hpp"

#include <pthread.h>
#include <sqlite3.h>

#include <fmt/format.h>

namespace weir::requestlog {

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS requests (
  id INTEGER PRIMARY KEY,
  ts_us INTEGER NOT NULL,
  request_id TEXT NOT NULL,
  tenant TEXT,
  key_id TEXT,
  model TEXT,
  status INTEGER NOT NULL,
  record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts_us, id);
CREATE INDEX IF NOT EXISTS requests_tenant ON requests (tenant, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_key_id ON requests (key_id, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_model ON requests (model, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_status ON requests (status, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_request_id ON requests (request_id);
PRAGMA user_version = 1;
)sql";

constexpr std::int64_t kRetentionChunk = 10'000;
constexpr auto kReportEvery = std::chrono::seconds(10);
constexpr auto kReopenEvery = std::chrono::seconds(1);

// Length of the well-formed UTF-8 sequence at s[i], 0 if there is none.
std::size_t utf8_len(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

// `s` with every byte that starts no well-formed sequence replaced by U+FFFD.
std::string_view make_valid(std::string_view s, std::string& out) {
  if (valid_utf8(s)) return s;
  out.clear();
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_len(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace

bool valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

Writer::Writer(RequestLogConfig config, unsigned workers) : config_(std::move(config)) {
  for (unsigned i = 0; i < workers; ++i) queues_.push_back(std::make_unique<RecordQueue>(config_.queue));
}

Writer::~Writer() {
  if (thread_.joinable()) stop(SteadyClock::now());
}

void Writer::close_statements() {
  for (Stmt* s : {&begin_, &commit_, &rollback_, &insert_, &delete_older_, &nth_newest_, &delete_upto_}) *s = Stmt();
}

void Writer::count_error(const std::string& what) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  last_error_ = what;
}

bool Writer::open_store(std::string& error) {
  close_statements();
  auto fail = [&](std::string why) {
    error = fmt::format("request log {}: {}", config_.path, why);
    count_error(error);
    close_statements();
    db_.close();
    open_.store(false, std::memory_order_relaxed);
    return false;
  };
  std::string why;
  if (!db_.open(config_.path, false, why)) return fail(why);
  // WAL: readers (the admin API's queries) never block the writer nor it
  // them; synchronous=NORMAL syncs at checkpoints, not per commit (a power
  // loss may lose the last transactions, never corrupt the file).
  if (!db_.exec("PRAGMA busy_timeout = 2000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;", why))
    return fail(why);
  if (!db_.exec(kSchema, why)) return fail(why);
  struct P {
    Stmt* out;
    const char* sql;
  };
  for (P p :
       {P{&begin_, "BEGIN IMMEDIATE"}, P{&commit_, "COMMIT"}, P{&rollback_, "ROLLBACK"},
        P{&insert_,
          "INSERT INTO requests (ts_us, request_id, tenant, key_id, model, status, record) "
          "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"},
        P{&delete_older_, "DELETE FROM requests WHERE id IN (SELECT id FROM requests WHERE ts_us < ?1 LIMIT 10000)"},
        P{&nth_newest_, "SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET ?1"},
        P{&delete_upto_,
          "DELETE FROM requests WHERE id IN (SELECT id FROM requests WHERE id <= ?1 ORDER BY id LIMIT 10000)"}}) {
    *p.out = db_.prepare(p.sql, why);
    if (!*p.out) return fail(why);
  }
  open_.store(true, std::memory_order_relaxed);
  return true;
}

std::size_t Writer::write_batch() {
  if (!db_ || queues_.empty()) return 0;
  std::size_t taken = 0;
  bool failed = false;
  bool in_txn = false;
  // Takes records from the queues in turn (one queue's backlog cannot starve the others).
  for (std::size_t visited = 0; visited < queues_.size() && taken < config_.batch && !failed; ++visited) {
    auto& q = *queues_[next_queue_];
    next_queue_ = (next_queue_ + 1) % queues_.size();
    while (taken < config_.batch) {
      const Record* r = q.front();
      if (!r) break;
      if (!in_txn) {
        const int rc = begin_.step();
        begin_.reset();
        if (rc != SQLITE_DONE) {
          count_error(fmt::format("request log {}: BEGIN: {}", config_.path, db_.errmsg()));
          return 0;  // nothing taken: the records stay queued
        }
        in_txn = true;
      }
      insert_.bind(1, r->ts_us);
      insert_.bind(2, make_valid(r->request_id, scratch_));
      // Bound as static text: each view must outlive the step, so one scratch per column.
      std::string s_tenant, s_key, s_model;
      insert_.bind_text_or_null(3, make_valid(r->tenant, s_tenant));
      insert_.bind_text_or_null(4, make_valid(r->key_id, s_key));
      insert_.bind_text_or_null(5, make_valid(r->model, s_model));
      insert_.bind(6, static_cast<std::int64_t>(r->status));
      insert_.bind(7, std::string_view(r->json));
      const int rc = insert_.step();
      insert_.reset();
      q.pop();
      ++taken;
      if (rc != SQLITE_DONE) {
        count_error(fmt::format("request log {}: INSERT: {}", config_.path, db_.errmsg()));
        failed = true;
        break;
      }
    }
  }
  if (!in_txn) return taken;
  if (!failed) {
    const int rc = commit_.step();
    commit_.reset();
    if (rc != SQLITE_DONE) {
      count_error(fmt::format("request log {}: COMMIT: {}", config_.path, db_.errmsg()));
      failed = true;
    }
  }
  ++transactions_;
  if (failed) {
    rollback_.step();
    rollback_.reset();
    dropped_write_.fetch_add(taken, std::memory_order_relaxed);
    // Start over from a fresh connection (a file deleted or replaced, a full disk cleared).
    db_.close();
    open_.store(false, std::memory_order_relaxed);
  } else {
    written_.fetch_add(taken, std::memory_order_relaxed);
  }
  return taken;
}

std::int64_t Writer::delete_chunked(Stmt& stmt, std::int64_t arg) {
  std::int64_t total = 0;
  for (;;) {
    stmt.bind(1, arg);
    const int rc = stmt.step();
    stmt.reset();
    if (rc != SQLITE_DONE) {
      count_error(fmt::format("request log {}: retention: {}", config_.path, db_.errmsg()));
      break;
    }
    const auto n = db_.changes();
    total += n;
    if (n < kRetentionChunk) break;
  }
  return total;
}

void Writer::apply_retention(std::int64_t now_us) {
  if (!db_) return;
  std::int64_t deleted = 0;
  if (config_.max_age.count() > 0) deleted += delete_chunked(delete_older_, now_us - config_.max_age.count() * 1000);
  if (config_.max_rows > 0) {
    nth_newest_.bind(1, static_cast<std::int64_t>(config_.max_rows));
    const int rc = nth_newest_.step();
    const std::int64_t cut = rc == SQLITE_ROW ? nth_newest_.column_int64(0) : -1;
    nth_newest_.reset();
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
      count_error(fmt::format("request log {}: retention: {}", config_.path, db_.errmsg()));
    if (cut >= 0) deleted += delete_chunked(delete_upto_, cut);
  }
  deleted_.fetch_add(static_cast<std::uint64_t>(deleted), std::memory_order_relaxed);
}

void Writer::start() {
  std::string error;
  if (!open_store(error))
    fmt::print(stderr,
               "weir: {}; serving on: records wait in the queues (dropped and counted when full) while it is "
               "retried every second\n",
               error);
  reported_errors_ = errors_.load(std::memory_order_relaxed);
  last_report_ = SteadyClock::now();
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "weir-requestlog");  // at most 15 characters
}

void Writer::stop(SteadyClock::time_point deadline) {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    deadline_ = deadline;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Writer::report(bool now_anyway) {
  const auto now = SteadyClock::now();
  if (!now_anyway && now - last_report_ < kReportEvery) return;
  std::uint64_t drops = dropped_write_.load(std::memory_order_relaxed);
  for (const auto& q : queues_) drops += q->dropped();
  const std::uint64_t errors = errors_.load(std::memory_order_relaxed);
  if (drops != reported_drops_)
    fmt::print(stderr, "weir: request log: {} records dropped in the last {}s ({})\n", drops - reported_drops_,
               std::chrono::duration_cast<std::chrono::seconds>(now - last_report_).count(),
               db_ ? "the store is slow: queue full" : "the store is not open");
  if (errors != reported_errors_) fmt::print(stderr, "weir: {} ({} errors)\n", last_error_, errors - reported_errors_);
  reported_drops_ = drops;
  reported_errors_ = errors;
  last_report_ = now;
}

void Writer::run() {
  auto unix_us = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  auto next_retention = SteadyClock::now();
  auto next_open = SteadyClock::now() + kReopenEvery;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (stop_) break;
    }
    std::size_t n = 0;
    if (!db_) {
      if (SteadyClock::now() >= next_open) {
        std::string error;
        open_store(error);
        next_open = SteadyClock::now() + kReopenEvery;
      }
    } else {
      n = write_batch();
      if (db_ && SteadyClock::now() >= next_retention) {
        apply_retention(unix_us());
        next_retention = SteadyClock::now() + config_.retention_interval;
      }
    }
    report();
    if (n < config_.batch) {
      // Short of a batch: wait for the next flush (or the stop).
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, config_.flush_interval, [this] { return stop_; });
    }
  }
  // The drain: the workers have stopped, so the queues only shrink.
  SteadyClock::time_point deadline;
  {
    std::lock_guard lock(mu_);
    deadline = deadline_;
  }
  for (;;) {
    if (!db_) {
      std::string error;
      if (!open_store(error)) break;
    }
    if (write_batch() == 0 && db_) break;
    if (SteadyClock::now() >= deadline) break;
  }
  std::uint64_t left = 0;
  for (auto& q : queues_)
    while (q->front()) {
      q->pop();
      ++left;
    }
  dropped_shutdown_.fetch_add(left, std::memory_order_relaxed);
  if (left) fmt::print(stderr, "weir: request log: {} records not written at shutdown (drain deadline)\n", left);
  report(true);
  close_statements();
  db_.close();
  open_.store(false, std::memory_order_relaxed);
}

WriterStats Writer::stats() const {
  WriterStats s;
  s.written = written_.load(std::memory_order_relaxed);
  for (const auto& q : queues_) {
    s.dropped_queue_full += q->dropped();
    s.queued += q->size();
  }
  s.dropped_write_error = dropped_write_.load(std::memory_order_relaxed);
  s.dropped_shutdown = dropped_shutdown_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  s.deleted = deleted_.load(std::memory_order_relaxed);
  s.open = open_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace weir::requestlog
