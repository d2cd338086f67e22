#include "requestlog/sqlite.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <fmt/format.h>

#include "core/dynamic_library.hpp"

namespace weir::requestlog {

namespace {

// libsqlite3 is loaded when a request-log store first opens a database
// (dlopen, as libpq is: postgres.cpp), not at start: a Weir without
// request_log maps none of it (idle RSS).
struct Libsqlite {
  decltype(&::sqlite3_bind_int64) bind_int64 = nullptr;
  decltype(&::sqlite3_bind_null) bind_null = nullptr;
  decltype(&::sqlite3_bind_text64) bind_text64 = nullptr;
  decltype(&::sqlite3_changes64) changes64 = nullptr;
  decltype(&::sqlite3_close) close = nullptr;
  decltype(&::sqlite3_close_v2) close_v2 = nullptr;
  decltype(&::sqlite3_column_bytes) column_bytes = nullptr;
  decltype(&::sqlite3_column_int64) column_int64 = nullptr;
  decltype(&::sqlite3_column_text) column_text = nullptr;
  decltype(&::sqlite3_db_filename) db_filename = nullptr;
  decltype(&::sqlite3_errcode) errcode = nullptr;
  decltype(&::sqlite3_errmsg) errmsg = nullptr;
  decltype(&::sqlite3_errstr) errstr = nullptr;
  decltype(&::sqlite3_exec) exec = nullptr;
  decltype(&::sqlite3_file_control) file_control = nullptr;
  decltype(&::sqlite3_filename_wal) filename_wal = nullptr;
  decltype(&::sqlite3_finalize) finalize = nullptr;
  decltype(&::sqlite3_free) free = nullptr;
  decltype(&::sqlite3_open_v2) open_v2 = nullptr;
  decltype(&::sqlite3_prepare_v3) prepare_v3 = nullptr;
  decltype(&::sqlite3_reset) reset = nullptr;
  decltype(&::sqlite3_step) step = nullptr;
  std::string error;  // why it could not be loaded; empty when loaded
};

const Libsqlite& lib() {
  static const Libsqlite lib = [] {
    Libsqlite l;
    core::DynamicLibrary so("libsqlite3.so.0", "the SQLite library (libsqlite3.so.0, Debian package libsqlite3-0)");
    so.load(l.bind_int64, "sqlite3_bind_int64");
    so.load(l.bind_null, "sqlite3_bind_null");
    so.load(l.bind_text64, "sqlite3_bind_text64");
    so.load(l.changes64, "sqlite3_changes64");
    so.load(l.close, "sqlite3_close");
    so.load(l.close_v2, "sqlite3_close_v2");
    so.load(l.column_bytes, "sqlite3_column_bytes");
    so.load(l.column_int64, "sqlite3_column_int64");
    so.load(l.column_text, "sqlite3_column_text");
    so.load(l.db_filename, "sqlite3_db_filename");
    so.load(l.errcode, "sqlite3_errcode");
    so.load(l.errmsg, "sqlite3_errmsg");
    so.load(l.errstr, "sqlite3_errstr");
    so.load(l.exec, "sqlite3_exec");
    so.load(l.file_control, "sqlite3_file_control");
    so.load(l.filename_wal, "sqlite3_filename_wal");
    so.load(l.finalize, "sqlite3_finalize");
    so.load(l.free, "sqlite3_free");
    so.load(l.open_v2, "sqlite3_open_v2");
    so.load(l.prepare_v3, "sqlite3_prepare_v3");
    so.load(l.reset, "sqlite3_reset");
    so.load(l.step, "sqlite3_step");
    l.error = so.error();
    return l;
  }();
  return lib;
}

// The device and inode of what `path` names (a stat: links followed); false when nothing is there.
bool identity(const std::string& path, dev_t& dev, ino_t& ino) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  dev = st.st_dev;
  ino = st.st_ino;
  return true;
}

}  // namespace

std::string resolve_links(const std::string& path) {
  std::string p = path;
  // 40 links at most, as the kernel's own lookup (ELOOP): a loop is left to the open, which says so.
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string target(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 255) + 1, '\0');
    const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0 || static_cast<std::size_t>(n) >= target.size()) return p;  // gone, or grew: the open decides
    target.resize(static_cast<std::size_t>(n));
    if (target.starts_with('/')) {
      p = std::move(target);
    } else {
      // Relative to the link's own directory.
      const auto slash = p.rfind('/');
      p = slash == std::string::npos ? target : p.substr(0, slash + 1) + target;
    }
  }
  return p;
}

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    if (s_) lib().finalize(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Stmt::~Stmt() {
  if (s_) lib().finalize(s_);
}

void Stmt::bind(int i, std::int64_t v) { lib().bind_int64(s_, i, v); }

void Stmt::bind(int i, std::string_view text) {
  lib().bind_text64(s_, i, text.data(), text.size(), SQLITE_STATIC, SQLITE_UTF8);
}

void Stmt::bind_text_or_null(int i, std::string_view text) {
  if (text.empty())
    lib().bind_null(s_, i);
  else
    bind(i, text);
}

int Stmt::step() { return lib().step(s_); }

void Stmt::reset() { lib().reset(s_); }

std::int64_t Stmt::column_int64(int i) const { return lib().column_int64(s_, i); }

std::string_view Stmt::column_text(int i) const {
  const auto* p = lib().column_text(s_, i);
  if (!p) return {};
  return {reinterpret_cast<const char*>(p), static_cast<std::size_t>(lib().column_bytes(s_, i))};
}

Db::Db(Db&& o) noexcept
    : db_(o.db_),
      path_(std::move(o.path_)),
      wal_path_(std::move(o.wal_path_)),
      path_named_(o.path_named_),
      main_dev_(o.main_dev_),
      main_ino_(o.main_ino_),
      wal_noted_(o.wal_noted_),
      wal_dev_(o.wal_dev_),
      wal_ino_(o.wal_ino_) {
  o.db_ = nullptr;
  o.wal_noted_ = false;
}

Db& Db::operator=(Db&& o) noexcept {
  if (this != &o) {
    close();
    db_ = o.db_;
    path_ = std::move(o.path_);
    wal_path_ = std::move(o.wal_path_);
    path_named_ = o.path_named_;
    main_dev_ = o.main_dev_;
    main_ino_ = o.main_ino_;
    wal_noted_ = o.wal_noted_;
    wal_dev_ = o.wal_dev_;
    wal_ino_ = o.wal_ino_;
    o.db_ = nullptr;
    o.wal_noted_ = false;
  }
  return *this;
}

Db::~Db() { close(); }

bool Db::open(const std::string& path, bool read_only, std::string& error) {
  close();
  if (!lib().error.empty()) {
    error = lib().error;
    return false;
  }
  if (!read_only) {
    // A request log holds prompts and completions (capture_bodies), JWT
    // subjects and tenants: a new file is made 0600 (as the key store's
    // file is), not 0644 under the usual umask as SQLite would make it.
    // SQLite gives the -wal and -shm files the database file's mode. An
    // existing file keeps the mode its operator gave it (O_EXCL); any other
    // failure is left to SQLite's open, which says why. (fchmod: 0600 also
    // under a umask that would take the owner's write away.) A path that is
    // a symbolic link (one whose file is not there yet too: O_EXCL would
    // refuse the link itself) is made where the link leads, as SQLite opens
    // it there.
    const int fd = ::open(resolve_links(path).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::fchmod(fd, 0600);
      ::close(fd);
    }
  }
  const int flags = (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) |
                    SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE;
  return open_name(path, path, flags, error);
}

bool Db::open_name(const std::string& name, const std::string& path, int flags, std::string& error) {
  sqlite3* db = nullptr;
  const int rc = lib().open_v2(name.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    error = db ? lib().errmsg(db) : lib().errstr(rc);
    lib().close(db);
    return false;
  }
  db_ = db;
  path_ = path;
  // SQLite's own name for the log: beside the file it opened, where a symbolic link at `path` led.
  const char* main = lib().db_filename(db, "main");
  const char* wal = main && *main ? lib().filename_wal(main) : nullptr;
  wal_path_ = wal && *wal ? std::string(wal) : resolve_links(path) + "-wal";
  // What `path` names now (a file not made yet by a read-only open: nothing): has_moved() compares.
  path_named_ = identity(path, main_dev_, main_ino_);
  return true;
}

bool Db::open_immutable(const std::string& path, std::string& error) {
  close();
  if (!lib().error.empty()) {
    error = lib().error;
    return false;
  }
  // A URI filename (https://sqlite.org/uri.html): '%', '?' and '#' in the path percent-encoded; an absolute
  // path after an empty authority ("file:///srv/x.db"), a relative one as it is (it cannot start with '/').
  std::string uri = path.starts_with('/') ? "file://" : "file:";
  for (char c : path) {
    if (c == '%' || c == '?' || c == '#')
      uri += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    else
      uri += c;
  }
  uri += "?immutable=1";
  return open_name(uri, path, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE,
                   error);
}

void Db::close() {
  if (db_) lib().close_v2(db_);
  db_ = nullptr;
  wal_noted_ = false;
}

bool Db::exec(const char* sql, std::string& error) {
  char* msg = nullptr;
  if (lib().exec(db_, sql, nullptr, nullptr, &msg) == SQLITE_OK) return true;
  error = msg ? msg : errmsg();
  lib().free(msg);
  return false;
}

Stmt Db::prepare(std::string_view sql, std::string& error) {
  sqlite3_stmt* s = nullptr;
  if (lib().prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &s, nullptr) !=
      SQLITE_OK) {
    error = errmsg();
    return Stmt();
  }
  return Stmt(s);
}

std::string Db::errmsg() const { return db_ ? lib().errmsg(db_) : "not open"; }

int Db::errcode() const { return db_ ? lib().errcode(db_) & 0xff : SQLITE_OK; }

bool Db::has_moved() const {
  int moved = 0;
  if (db_ == nullptr || lib().file_control(db_, "main", SQLITE_FCNTL_HAS_MOVED, &moved) != SQLITE_OK) return false;
  if (moved != 0) return true;
  // SQLite watches the file it opened, by the name a symbolic link led to: a link re-pointed (or removed)
  // since leaves that file where it was, but the path names another (or none).
  if (!path_named_) return false;
  dev_t dev = 0;
  ino_t ino = 0;
  return !identity(path_, dev, ino) || dev != main_dev_ || ino != main_ino_;
}

void Db::note_wal() {
  wal_noted_ = db_ && identity(wal_path_, wal_dev_, wal_ino_);
  if (!wal_noted_) wal_dev_ = 0, wal_ino_ = 0;
}

bool Db::wal_replaced() const {
  if (!db_ || !wal_noted_) return false;
  dev_t dev = 0;
  ino_t ino = 0;
  return !identity(wal_path_, dev, ino) || ino != wal_ino_ || dev != wal_dev_;
}

std::string wal_obstacle(const std::string& path) {
  struct stat st {};
  if (::stat((resolve_links(path) + "-wal").c_str(), &st) != 0 || S_ISREG(st.st_mode)) return {};
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  return "not a regular file";
}

bool Db::checkpoint_truncate(std::string& error) {
  std::string why;
  Stmt s = prepare("PRAGMA wal_checkpoint(TRUNCATE)", why);
  if (!s) {
    error = why;
    return false;
  }
  // One row: busy (1 when a reader or writer kept it from finishing), frames in the log, frames checkpointed.
  if (s.step() != SQLITE_ROW) {
    error = errmsg();
    return false;
  }
  if (s.column_int64(0) != 0) {
    error = fmt::format("a checkpoint could not finish ({} of {} frames copied): a reader is in the way",
                        s.column_int64(2), s.column_int64(1));
    return false;
  }
  return true;
}

std::int64_t Db::changes() const { return lib().changes64(db_); }

}  // namespace weir::requestlog
