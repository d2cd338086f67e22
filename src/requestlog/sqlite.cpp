#include "requestlog/sqlite.hpp"

#include <sqlite3.h>

namespace weir::requestlog {

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    if (s_) sqlite3_finalize(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Stmt::~Stmt() {
  if (s_) sqlite3_finalize(s_);
}

void Stmt::bind(int i, std::int64_t v) { sqlite3_bind_int64(s_, i, v); }

void Stmt::bind(int i, std::string_view text) {
  sqlite3_bind_text64(s_, i, text.data(), text.size(), SQLITE_STATIC, SQLITE_UTF8);
}

void Stmt::bind_text_or_null(int i, std::string_view text) {
  if (text.empty())
    sqlite3_bind_null(s_, i);
  else
    bind(i, text);
}

int Stmt::step() { return sqlite3_step(s_); }

void Stmt::reset() { sqlite3_reset(s_); }

std::int64_t Stmt::column_int64(int i) const { return sqlite3_column_int64(s_, i); }

std::string_view Stmt::column_text(int i) const {
  const auto* p = sqlite3_column_text(s_, i);
  if (!p) return {};
  return {reinterpret_cast<const char*>(p), static_cast<std::size_t>(sqlite3_column_bytes(s_, i))};
}

Db& Db::operator=(Db&& o) noexcept {
  if (this != &o) {
    close();
    db_ = o.db_;
    o.db_ = nullptr;
  }
  return *this;
}

Db::~Db() { close(); }

bool Db::open(const std::string& path, bool read_only, std::string& error) {
  close();
  const int flags = (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) |
                    SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE;
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    error = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return false;
  }
  db_ = db;
  return true;
}

void Db::close() {
  if (db_) sqlite3_close_v2(db_);
  db_ = nullptr;
}

bool Db::exec(const char* sql, std::string& error) {
  char* msg = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &msg) == SQLITE_OK) return true;
  error = msg ? msg : errmsg();
  sqlite3_free(msg);
  return false;
}

Stmt Db::prepare(std::string_view sql, std::string& error) {
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &s, nullptr) !=
      SQLITE_OK) {
    error = errmsg();
    return Stmt();
  }
  return Stmt(s);
}

std::string Db::errmsg() const { return db_ ? sqlite3_errmsg(db_) : "not open"; }

std::int64_t Db::changes() const { return sqlite3_changes64(db_); }

}  // namespace weir::requestlog
