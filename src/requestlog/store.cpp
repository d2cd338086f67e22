#include "requestlog/store.hpp"

#include <openssl/evp.h>

#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/note.hpp"
#include "requestlog/redact.hpp"

namespace weir::requestlog {

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr auto kReportEvery = std::chrono::seconds(10);
// What a queue slot keeps of a record's access-log line and of its other columns between records (bytes).
constexpr std::size_t kKeptLineBytes = 1024;
constexpr std::size_t kKeptColumnBytes = 128;
constexpr auto kReopenEvery = std::chrono::seconds(1);

}  // namespace

std::string_view make_valid(std::string_view s, std::string& out) {
  if (valid_utf8(s)) return s;
  out.clear();
  core::append_valid_utf8(out, s);  // (the access log's rule: a column says what the line says)
  return out;
}

bool valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  for (;;) {
    // ASCII a word at a time: records are mostly ASCII JSON (this was ~4,000
    // instructions a record byte by byte, under bench/callgrind logged).
    while (i + 8 <= s.size()) {
      std::uint64_t w;
      std::memcpy(&w, s.data() + i, sizeof w);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) return true;
    const std::size_t n = core::utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
}

Writer::Writer(RequestLogConfig config, unsigned workers)
    : config_(std::move(config)),
      store_(config_.kind == StoreKind::postgres ? make_postgres_backend(config_) : make_sqlite_backend(config_)) {
  for (unsigned i = 0; i < workers; ++i) {
    queues_.push_back(std::make_unique<RecordQueue>(config_.queue));
    budgets_.push_back(std::make_unique<BodyBudget>());
  }
}

Writer::~Writer() {
  if (loop_.running()) stop(SteadyClock::now());
}

void Writer::count_error(const std::string& what) {
  errors_.fetch_add(1, std::memory_order_relaxed);
  last_error_ = what;
}

bool Writer::open_store(std::string& error) {
  std::string why;
  if (!store_->open(why)) {
    error = fmt::format("request log {}: {}", config_.display, why);
    count_error(error);
    open_.store(false, std::memory_order_relaxed);
    return false;
  }
  open_.store(true, std::memory_order_relaxed);
  return true;
}

namespace {

// Appends one captured body as {"size":N,"truncated":bool,"text":"..."}
// (valid UTF-8 without a NUL byte) or {..., "base64":"..."} (anything else),
// redacted first. A NUL byte as text would be the escape \u0000, which
// PostgreSQL's json and jsonb refuse: one such row failed every
// `bodies::jsonb` query over the table; base64 keeps its bytes as they came.
void append_body(std::string& out, const CapturedBody& b, std::string& text) {
  text.assign(b.bytes);
  redact_patterns(text, b.truncated);
  fmt::format_to(std::back_inserter(out), R"({{"size":{},"truncated":{},)", b.size, b.truncated);
  std::string_view v = text;
  // A multi-byte character cut by the cap is not a reason for base64.
  if (b.truncated && !valid_utf8(v))
    for (int k = 0; k < 3 && !v.empty() && !valid_utf8(v); ++k) v.remove_suffix(1);
  if (valid_utf8(v) && v.find('\0') == std::string_view::npos) {
    out += R"("text":)";
    core::append_json_string(out, v);
  } else {
    out += R"("base64":")";
    const std::size_t at = out.size();
    out.resize(at + 4 * ((text.size() + 2) / 3) + 1);
    const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data() + at),
                                  reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
    out.resize(at + static_cast<std::size_t>(n));
    out += '"';
  }
  out += '}';
}

// Makes `s` valid UTF-8 in place (the slot is the writer's until pop()).
void make_valid_in_place(std::string& s, std::string& scratch) {
  if (valid_utf8(s)) return;
  make_valid(s, scratch);
  s.swap(scratch);
}

}  // namespace

std::string_view Writer::bodies_json(Record& r) {
  bodies_.clear();
  if (!r.request_body.present && !r.response_body.present) return {};
  bodies_ += '{';
  if (r.request_body.present) {
    bodies_ += R"("request":)";
    append_body(bodies_, r.request_body, body_text_);
  }
  if (r.response_body.present) {
    if (r.request_body.present) bodies_ += ',';
    bodies_ += R"("response":)";
    append_body(bodies_, r.response_body, body_text_);
  }
  bodies_ += '}';
  return bodies_;
}

std::size_t Writer::write_batch() {
  if (!store_->is_open() || queues_.empty()) return 0;
  // A file (or SQLite's -wal) deleted or replaced under the open connection (logrotate, an operator's rm)
  // takes every write without an error, into an unlinked inode: lost at the restart, counted as written.
  // Opened again (a new file at the path) before the batch; counted as an error and said at once, once, with
  // what the new open did: a line that said the store was opening again when it could not (PATH-wal replaced
  // by a directory) would leave the operator waiting for it.
  if (std::string moved; store_->moved(moved)) {
    store_->close();
    open_.store(false, std::memory_order_relaxed);
    std::string error;
    const bool reopened = open_store(error);  // (a failure is counted too, as every failed open is)
    if (reopened) {
      count_error(fmt::format("request log {}: {}; opening it again", config_.display, moved));
    } else {
      const std::string prefix = fmt::format("request log {}: ", config_.display);
      count_error(
          fmt::format("{}{}; it cannot be opened again: {}; records wait in the queues (dropped and "
                      "counted when full) while it is retried every second",
                      prefix, moved, error.starts_with(prefix) ? error.substr(prefix.size()) : error));
    }
    say_now();
    if (!reopened) return 0;
  } else if (!moved.empty()) {
    count_error(fmt::format("request log {}: {}", config_.display, moved));
  }
  std::size_t taken = 0;
  bool failed = false;
  bool in_txn = false;
  std::string why;
  // Takes records from the queues in turn (one queue's backlog cannot starve the others).
  for (std::size_t visited = 0; visited < queues_.size() && taken < config_.batch && !failed; ++visited) {
    auto& q = *queues_[next_queue_];
    auto& budget = *budgets_[next_queue_];
    next_queue_ = (next_queue_ + 1) % queues_.size();
    while (taken < config_.batch) {
      Record* r = q.front();
      if (!r) break;
      if (!in_txn) {
        if (!store_->begin(why)) {
          count_error(fmt::format("request log {}: {}", config_.display, why));
          last_write_failed_ = true;
          store_->rollback();
          return 0;  // nothing taken: the records stay queued
        }
        in_txn = true;
      }
      for (std::string* col : {&r->request_id, &r->tenant, &r->key_id, &r->model, &r->json})
        make_valid_in_place(*col, scratch_);
      const bool ok = store_->add(*r, bodies_json(*r), why);
      // Stored: the ring's slots do not keep bodies (queue × caps of memory otherwise).
      for (CapturedBody* b : {&r->request_body, &r->response_body}) {
        budget.give(static_cast<std::int64_t>(b->bytes.size()));
        b->clear();
        if (b->bytes.capacity() > 4096) std::string().swap(b->bytes);
      }
      // Nor a long line's: a slot keeps what a usual line needs (~0.5 KiB), never what the largest one
      // took (a 256-byte model name of control characters escapes to a 2 KiB line), so the queue's
      // resident memory is at most queue × ~1.5 KiB per worker, whatever clients send.
      core::release_above(r->json, kKeptLineBytes);
      for (std::string* col : {&r->request_id, &r->tenant, &r->key_id, &r->model})
        core::release_above(*col, kKeptColumnBytes);
      q.pop();
      ++taken;
      if (!ok) {
        count_error(fmt::format("request log {}: {}", config_.display, why));
        failed = true;
        break;
      }
    }
  }
  if (!in_txn) return taken;
  if (!failed && !store_->commit(why)) {
    count_error(fmt::format("request log {}: {}", config_.display, why));
    failed = true;
  }
  ++transactions_;
  last_write_failed_ = failed;
  if (failed) {
    store_->rollback();
    dropped_write_.fetch_add(taken, std::memory_order_relaxed);
    // Start over from a fresh connection (a file deleted or replaced, a full disk cleared, a server restarted).
    store_->close();
    open_.store(false, std::memory_order_relaxed);
  } else {
    written_.fetch_add(taken, std::memory_order_relaxed);
  }
  return taken;
}

void Writer::apply_retention(std::int64_t now_us) {
  if (!store_->is_open()) return;
  std::int64_t deleted = 0;
  std::string why;
  if (config_.max_age.count() > 0) {
    deleted += store_->delete_older(now_us - config_.max_age.count() * 1000, why);
    if (!why.empty()) count_error(fmt::format("request log {}: {}", config_.display, why));
  }
  if (config_.max_rows > 0 && why.empty()) {
    deleted += store_->keep_newest(config_.max_rows, why);
    if (!why.empty()) count_error(fmt::format("request log {}: {}", config_.display, why));
  }
  deleted_.fetch_add(static_cast<std::uint64_t>(deleted), std::memory_order_relaxed);
}

void Writer::start() {
  std::string error;
  if (!open_store(error))
    weir::core::note(
        "weir: {}; serving on: records wait in the queues (dropped and counted when full) while it is "
        "retried every second\n",
        error);
  reported_errors_ = errors_.load(std::memory_order_relaxed);
  last_report_ = SteadyClock::now();
  next_retention_ = SteadyClock::now();
  next_open_ = SteadyClock::now() + kReopenEvery;
  loop_.start(
      "weir-requestlog", config_.priority, config_.batch, config_.flush_interval, [this] { return step(); },
      [this](SteadyClock::time_point deadline) { drain(deadline); });
}

bool Writer::stop(SteadyClock::time_point deadline) {
  return loop_.stop_within(deadline, deadline + std::chrono::seconds(1));
}

void Writer::report(bool now_anyway) {
  const auto now = SteadyClock::now();
  if (!now_anyway && now - last_report_ < kReportEvery) return;
  std::uint64_t queue_full = 0;
  for (const auto& q : queues_) queue_full += q->dropped();
  const std::uint64_t write_error = dropped_write_.load(std::memory_order_relaxed);
  const std::uint64_t errors = errors_.load(std::memory_order_relaxed);
  // Says why, by the reasons of weir_request_log_dropped_total that moved:
  // a full queue is a slow store, one that is not open or one whose last
  // write failed (locked by another writer: the error says so), a failed
  // batch is the store refusing writes (a full disk, a malformed file).
  // Shutdown's drops have their own line (drain()).
  const std::uint64_t new_full = queue_full - reported_queue_full_, new_failed = write_error - reported_write_error_;
  if (new_full + new_failed > 0) {
    std::string why;
    if (new_full > 0) why = fmt::format("{} with the queue full: {}", new_full, queue_full_reason());
    if (new_failed > 0)
      why += fmt::format("{}{} in batches the store failed to write", why.empty() ? "" : "; ", new_failed);
    weir::core::note("weir: request log: {} records dropped in the last {}s ({})\n", new_full + new_failed,
                     std::chrono::duration_cast<std::chrono::seconds>(now - last_report_).count(), why);
  }
  if (errors != reported_errors_) weir::core::note("weir: {} ({} errors)\n", last_error_, errors - reported_errors_);
  reported_queue_full_ = queue_full;
  reported_write_error_ = write_error;
  reported_errors_ = errors;
  last_report_ = now;
}

std::string Writer::queue_full_reason() const {
  if (!store_->is_open())
    return last_error_.empty() ? "the store is not open" : fmt::format("the store is not open: {}", last_error_);
  if (last_write_failed_ && !last_error_.empty()) return fmt::format("the last write failed: {}", last_error_);
  return "the store is slow";
}

void Writer::say_now() {
  weir::core::note("weir: {}\n", last_error_);
  reported_errors_ = errors_.load(std::memory_order_relaxed);
}

std::size_t Writer::step() {
  std::size_t n = 0;
  if (!store_->is_open()) {
    if (SteadyClock::now() >= next_open_) {
      std::string error;
      open_store(error);
      next_open_ = SteadyClock::now() + kReopenEvery;
    }
  } else {
    n = write_batch();
    if (store_->is_open() && SteadyClock::now() >= next_retention_) {
      apply_retention(
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count());
      next_retention_ = SteadyClock::now() + config_.retention_interval;
    }
  }
  report();
  return n;
}

void Writer::drain(SteadyClock::time_point deadline) {
  // The workers have stopped, so the queues only shrink. Why what is left is left: the store not opening,
  // a write refused (locked by another writer), else the deadline (with the last error, if writes failed).
  const std::uint64_t errors_before = errors_.load(std::memory_order_relaxed);
  std::string stopped = "drain deadline";
  for (;;) {
    if (!store_->is_open()) {
      std::string error;
      if (!open_store(error)) {
        stopped = error;
        break;
      }
    }
    if (write_batch() == 0 && store_->is_open()) {
      if (last_write_failed_) stopped = last_error_;
      break;
    }
    if (SteadyClock::now() >= deadline) {
      if (errors_.load(std::memory_order_relaxed) != errors_before)
        stopped = fmt::format("drain deadline; the last error: {}", last_error_);
      break;
    }
  }
  std::uint64_t left = 0;
  for (std::size_t i = 0; i < queues_.size(); ++i)
    while (Record* r = queues_[i]->front()) {
      budgets_[i]->give(static_cast<std::int64_t>(r->request_body.bytes.size() + r->response_body.bytes.size()));
      queues_[i]->pop();
      ++left;
    }
  dropped_shutdown_.fetch_add(left, std::memory_order_relaxed);
  if (left) weir::core::note("weir: request log: {} records not written at shutdown ({})\n", left, stopped);
  report(true);
  store_->close();
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
  for (const auto& b : budgets_) s.bodies_dropped += b->dropped.load(std::memory_order_relaxed);
  s.dropped_shutdown = dropped_shutdown_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  s.deleted = deleted_.load(std::memory_order_relaxed);
  s.open = open_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace weir::requestlog
