// A thin RAII layer over SQLite's C API (https://sqlite.org/c3ref/intro.html):
// a connection and prepared statements that finalize themselves. Errors are
// SQLite's result codes; the message is the connection's sqlite3_errmsg().
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace weir::requestlog {

class Stmt {
 public:
  Stmt() = default;
  explicit Stmt(sqlite3_stmt* s) : s_(s) {}
  Stmt(Stmt&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stmt& operator=(Stmt&& o) noexcept;
  ~Stmt();
  explicit operator bool() const { return s_ != nullptr; }

  // Parameters are 1-based. Text is bound without a copy (SQLITE_STATIC):
  // it must stay valid until the statement is stepped and reset.
  void bind(int i, std::int64_t v);
  void bind(int i, std::string_view text);
  void bind_text_or_null(int i, std::string_view text);  // empty → NULL
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int step();
  void reset();
  std::int64_t column_int64(int i) const;
  std::string_view column_text(int i) const;  // empty for NULL

 private:
  sqlite3_stmt* s_ = nullptr;
};

class Db {
 public:
  Db() = default;
  Db(Db&& o) noexcept;
  Db& operator=(Db&& o) noexcept;
  ~Db();
  explicit operator bool() const { return db_ != nullptr; }

  // Opens `path` read-write (creating it, mode 0600: it holds what clients
  // sent; where a symbolic link at `path` leads, when it is one) or
  // read-only; false with `error` set.
  bool open(const std::string& path, bool read_only, std::string& error);
  // Opens `path` read-only as immutable (the URI parameter immutable=1,
  // https://sqlite.org/uri.html): no locks, no -shm, no -wal. Right only for
  // a file no writer has open (one cleanly closed: its last writer
  // checkpointed and removed PATH-wal), as in a directory the reader cannot
  // write, where a WAL-mode reader cannot make PATH-shm. False with `error`.
  bool open_immutable(const std::string& path, std::string& error);
  void close();
  // Runs one or more statements; false with `error` set.
  bool exec(const char* sql, std::string& error);
  // A prepared statement, or an empty one with `error` set.
  Stmt prepare(std::string_view sql, std::string& error);
  std::string errmsg() const;
  // The last call's result code, without its extension (SQLITE_CANTOPEN,
  // SQLITE_READONLY, ...; SQLITE_OK when not open).
  int errcode() const;
  std::int64_t changes() const;
  // The database file was deleted, renamed or replaced since it was opened
  // (SQLITE_FCNTL_HAS_MOVED): writes would go to an unlinked file, lost; or
  // the path opened names another file now, or none (a symbolic link there
  // re-pointed or removed: two stats). Open again, the path's new file is used.
  bool has_moved() const;
  // The write-ahead log's path, as SQLite names it (sqlite3_filename_wal):
  // FILE-wal beside the file a symbolic link at the path opened led to.
  const std::string& wal_path() const { return wal_path_; }
  // Remembers which file the log (wal_path()) is (its device and inode; a stat), for
  // wal_replaced(): call it once the connection has the log open (after its
  // first statement on a WAL-mode file). None there (not WAL mode, an
  // immutable connection): nothing to watch.
  void note_wal();
  // PATH-wal was deleted or replaced since note_wal() (a stat; false
  // before it, or when it noted none). The connection keeps the log it opened, now unlinked:
  // SQLite does not notice (SQLITE_FCNTL_HAS_MOVED is the main file's).
  // What a writer commits there is read by the connections that opened it
  // too, and lost when the last of them closes without a checkpoint (a
  // crash, or a read-only one last); a connection opened since reads
  // another log against the shared index. checkpoint_truncate() saves it.
  bool wal_replaced() const;
  // PRAGMA wal_checkpoint(TRUNCATE) (https://sqlite.org/pragma.html#pragma_wal_checkpoint):
  // every frame of the log this connection has open copied into the main
  // file, then the log emptied and restarted. False with `error` set when
  // it failed or was not done whole (a reader still in a snapshot past the
  // busy timeout).
  bool checkpoint_truncate(std::string& error);

 private:
  // sqlite3_open_v2 of `name` (a path, or a file: URI) with `flags`, kept as the file `path`; false with
  // `error` set (nothing left open).
  bool open_name(const std::string& name, const std::string& path, int flags, std::string& error);

  sqlite3* db_ = nullptr;
  std::string path_;         // as opened
  std::string wal_path_;     // the log's path (wal_path())
  bool path_named_ = false;  // path_ named a file just after the open: main_dev_/main_ino_ are its
  dev_t main_dev_ = 0;
  ino_t main_ino_ = 0;
  bool wal_noted_ = false;  // note_wal() ran since the open
  dev_t wal_dev_ = 0;       // PATH-wal's device and inode at note_wal()
  ino_t wal_ino_ = 0;
};

// `path` with the symbolic links it names followed (its last component's, 40 at most; relative targets
// from the link's directory), also when the last one leads nowhere yet: where SQLite opens or makes the
// file, and its FILE-wal beside it. `path` itself when it is not a link.
std::string resolve_links(const std::string& path);

// What is at FILE-wal (FILE: `path` through resolve_links) when it is not SQLite's write-ahead log to open:
// "a directory", "a FIFO", "a socket", "a device", "not a regular file" (a stat; a symlink is followed).
// Empty when nothing is there or
// a regular file is (which SQLite opens or makes). SQLite answers only "unable to open database file" for
// such a path; a message that names it tells the operator what to remove.
std::string wal_obstacle(const std::string& path);

}  // namespace weir::requestlog
