// The request log in SQLite: one file in WAL mode (readers never block the
// writer nor it them), prepared statements, one transaction per batch.
#include <sqlite3.h>

#include <chrono>

#include <fmt/format.h>

#include "requestlog/backend.hpp"
#include "requestlog/sqlite.hpp"

namespace weir::requestlog {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS requests (
  id INTEGER PRIMARY KEY,
  ts_us INTEGER NOT NULL,
  request_id TEXT NOT NULL,
  tenant TEXT,
  key_id TEXT,
  model TEXT,
  status INTEGER NOT NULL,
  record TEXT NOT NULL,
  bodies TEXT
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (ts_us, id, tenant, key_id, model, status);
CREATE INDEX IF NOT EXISTS requests_request_id ON requests (request_id);
)sql";

// Schema 2 had an index per filter; each cost the writer ~8,000 instructions
// a row (bench/callgrind logged). One time index that carries the filter
// columns replaces them: a filtered query scans it newest first and tests
// the filters on the index entry (SQLite's deferred seek), loading only the
// rows it returns: at most the newest max_rows (1M: ~0.1 s) for a filter
// that matches nothing.
constexpr const char* kDropSchema2Indexes = R"sql(
DROP INDEX IF EXISTS requests_ts;
DROP INDEX IF EXISTS requests_tenant;
DROP INDEX IF EXISTS requests_key_id;
DROP INDEX IF EXISTS requests_model;
DROP INDEX IF EXISTS requests_status;
)sql";

class SqliteBackend final : public StoreBackend {
 public:
  explicit SqliteBackend(const RequestLogConfig& c) : path_(c.path) {}

  bool open(std::string& error) override {
    close();
    auto fail = [&](std::string why) {
      error = std::move(why);
      close();
      return false;
    };
    std::string why;
    // SQLite says only "unable to open database file" when PATH-wal is a directory (or another non-file): say
    // what is in the way.
    const auto fail_wal = [&](std::string sqlite_says) {
      if (const std::string what = wal_obstacle(path_); !what.empty())
        sqlite_says = fmt::format(
            "{}: {}-wal, where SQLite keeps the file's write-ahead log, is {}: remove it for the "
            "log to open",
            sqlite_says, resolve_links(path_), what);
      return fail(std::move(sqlite_says));
    };
    if (!db_.open(path_, false, why)) return fail_wal(why);
    // WAL: readers (the admin API's queries) never block the writer nor it
    // them; synchronous=NORMAL syncs at checkpoints, not per commit (a power
    // loss may lose the last transactions, never corrupt the file).
    if (!db_.exec("PRAGMA busy_timeout = 2000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;", why))
      return fail_wal(why);
    if (!db_.exec(kSchema, why)) return fail_wal(why);
    // Schema version 1 (before captured bodies) lacks the column.
    {
      Stmt has = db_.prepare("SELECT count(*) FROM pragma_table_info('requests') WHERE name = 'bodies'", why);
      if (!has) return fail(why);
      if (has.step() != SQLITE_ROW) return fail(db_.errmsg());
      const bool present = has.column_int64(0) > 0;
      has = Stmt();
      if (!present && !db_.exec("ALTER TABLE requests ADD COLUMN bodies TEXT", why)) return fail(why);
    }
    if (!db_.exec(kDropSchema2Indexes, why)) return fail(why);
    if (!db_.exec("PRAGMA user_version = 3", why)) return fail(why);
    struct P {
      Stmt* out;
      const char* sql;
    };
    for (P p :
         {P{&begin_, "BEGIN IMMEDIATE"}, P{&commit_, "COMMIT"}, P{&rollback_, "ROLLBACK"},
          P{&insert_,
            "INSERT INTO requests (ts_us, request_id, tenant, key_id, model, status, record, bodies) "
            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"},
          P{&delete_older_, "DELETE FROM requests WHERE id IN (SELECT id FROM requests WHERE ts_us < ?1 LIMIT 10000)"},
          P{&nth_newest_, "SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET ?1"},
          P{&delete_upto_,
            "DELETE FROM requests WHERE id IN (SELECT id FROM requests WHERE id <= ?1 ORDER BY id LIMIT 10000)"}}) {
      *p.out = db_.prepare(p.sql, why);
      if (!*p.out) return fail(why);
    }
    // The statements above opened the log: which file it is, for moved().
    db_.note_wal();
    next_wal_check_ = std::chrono::steady_clock::now() + kWalCheckEvery;
    return true;
  }

  bool is_open() const override { return static_cast<bool>(db_); }

  bool moved(std::string& why) override {
    if (!db_) return false;
    if (db_.has_moved()) {
      why = "the database file was deleted or replaced (or the path names another file now)";
      return true;
    }
    // The -wal file deleted or replaced (an operator's rm, a cleanup of "stale" files, a reader that made a
    // new one in its place): this connection writes on into the unlinked log, and its rows are lost at a
    // crash, or when a read-only connection (the admin API's, `weir requests`) is the last to close. SQLite
    // does not notice; a stat, at most once a second, does. The rows are copied into the file through this
    // connection's descriptor before it is left; until that can be done (a reader in the way) it stays.
    const auto now = std::chrono::steady_clock::now();
    if (now < next_wal_check_) return false;
    next_wal_check_ = now + kWalCheckEvery;
    if (!db_.wal_replaced()) return false;
    std::string error;
    if (!db_.checkpoint_truncate(error)) {
      why = fmt::format("its write-ahead log {} was deleted or replaced; its rows are not in the file yet: {}",
                        db_.wal_path(), error);
      return false;
    }
    if (const std::string what = wal_obstacle(path_); !what.empty())
      // (What a new log's open then meets: open() says it, and the writer that it failed.)
      why = fmt::format("its write-ahead log {} was replaced by {} (its rows were copied into the file)",
                        db_.wal_path(), what);
    else
      why = fmt::format("its write-ahead log {} was deleted or replaced (its rows were copied into the file)",
                        db_.wal_path());
    return true;
  }

  void close() override {
    for (Stmt* s : {&begin_, &commit_, &rollback_, &insert_, &delete_older_, &nth_newest_, &delete_upto_}) *s = Stmt();
    // A file renamed under the connection (logrotate, `mv requests.db requests.db.1`): SQLite skips its
    // checkpoint-on-close for a moved database, and the WAL (left at the old name, beside the new file the
    // writer opens next) is then taken for the new file's and reset: every row since the last checkpoint
    // would be lost, though counted written. An explicit checkpoint writes them into the renamed file
    // through the open descriptor first (for a deleted file it costs a write into the unlinked inode). A
    // -wal deleted or replaced (moved()) the same: the rows in it are copied into the file.
    if (db_ && (db_.has_moved() || db_.wal_replaced())) {
      std::string why;
      (void)db_.checkpoint_truncate(why);
    }
    db_.close();
  }

  bool begin(std::string& error) override { return step(begin_, "BEGIN", error); }

  bool add(const Record& r, std::string_view bodies, std::string& error) override {
    insert_.bind(1, r.ts_us);
    insert_.bind(2, std::string_view(r.request_id));
    insert_.bind_text_or_null(3, r.tenant);
    insert_.bind_text_or_null(4, r.key_id);
    insert_.bind_text_or_null(5, r.model);
    insert_.bind(6, static_cast<std::int64_t>(r.status));
    insert_.bind(7, std::string_view(r.json));
    insert_.bind_text_or_null(8, bodies);
    return step(insert_, "INSERT", error);
  }

  bool commit(std::string& error) override { return step(commit_, "COMMIT", error); }

  void rollback() override {
    if (!rollback_) return;
    rollback_.step();
    rollback_.reset();
  }

  std::int64_t delete_older(std::int64_t cutoff_us, std::string& error) override {
    return delete_chunked(delete_older_, cutoff_us, error);
  }

  std::int64_t keep_newest(std::uint64_t max_rows, std::string& error) override {
    nth_newest_.bind(1, static_cast<std::int64_t>(max_rows));
    const int rc = nth_newest_.step();
    const std::int64_t cut = rc == SQLITE_ROW ? nth_newest_.column_int64(0) : -1;
    nth_newest_.reset();
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      error = fmt::format("retention: {}", db_.errmsg());
      return 0;
    }
    return cut >= 0 ? delete_chunked(delete_upto_, cut, error) : 0;
  }

 private:
  bool step(Stmt& s, const char* what, std::string& error) {
    const int rc = s.step();
    s.reset();
    if (rc == SQLITE_DONE) return true;
    error = fmt::format("{}: {}", what, db_.errmsg());
    return false;
  }

  std::int64_t delete_chunked(Stmt& stmt, std::int64_t arg, std::string& error) {
    std::int64_t total = 0;
    for (;;) {
      stmt.bind(1, arg);
      const int rc = stmt.step();
      stmt.reset();
      if (rc != SQLITE_DONE) {
        error = fmt::format("retention: {}", db_.errmsg());
        return total;
      }
      const auto n = db_.changes();
      total += n;
      if (n < kRetentionChunk) break;
    }
    return total;
  }

  static constexpr auto kWalCheckEvery = std::chrono::seconds(1);

  std::string path_;
  Db db_;
  std::chrono::steady_clock::time_point next_wal_check_{};
  Stmt begin_, commit_, rollback_, insert_, delete_older_, nth_newest_, delete_upto_;
};

}  // namespace

std::unique_ptr<StoreBackend> make_sqlite_backend(const RequestLogConfig& config) {
  return std::make_unique<SqliteBackend>(config);
}

}  // namespace weir::requestlog
