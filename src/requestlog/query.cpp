#include "requestlog/query.hpp"

#include <sqlite3.h>
#include <sys/stat.h>

#include <charconv>
#include <iterator>

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/text.hpp"
#include "core/time.hpp"
#include "requestlog/store.hpp"

namespace weir::requestlog {

namespace {

// application/x-www-form-urlencoded decoding (WHATWG URL §5.1): '+' is a
// space, %XX a byte; a '%' not followed by two hex digits stays as it is.
std::string form_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && core::hex_value(s[i + 1]) >= 0 && core::hex_value(s[i + 2]) >= 0) {
      out += static_cast<char>(core::hex_value(s[i + 1]) * 16 + core::hex_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

int num(std::string_view s, std::size_t at, std::size_t n) {
  int v = 0;
  for (std::size_t i = at; i < at + n; ++i) v = v * 10 + (s[i] - '0');
  return v;
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms").
std::int64_t days_from_civil(int y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return static_cast<std::int64_t>(era) * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// RFC 3339 §5.6 date-time: YYYY-MM-DD(T|t| )HH:MM:SS[.frac](Z|z|±HH:MM) → Unix µs.
bool parse_rfc3339(std::string_view s, std::int64_t& us) {
  auto digits_at = [&](std::size_t at, std::size_t n) {
    if (at + n > s.size()) return false;
    for (std::size_t i = at; i < at + n; ++i)
      if (s[i] < '0' || s[i] > '9') return false;
    return true;
  };
  if (s.size() < 20 || !digits_at(0, 4) || s[4] != '-' || !digits_at(5, 2) || s[7] != '-' || !digits_at(8, 2) ||
      (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !digits_at(11, 2) || s[13] != ':' || !digits_at(14, 2) ||
      s[16] != ':' || !digits_at(17, 2))
    return false;
  const int y = num(s, 0, 4), mo = num(s, 5, 2), d = num(s, 8, 2), h = num(s, 11, 2), mi = num(s, 14, 2),
            sec = num(s, 17, 2);
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (mo < 1 || mo > 12) return false;
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (d < 1 || d > kDays[mo - 1] + (mo == 2 && leap)) return false;
  if (h > 23 || mi > 59 || sec > 60) return false;  // 60: a leap second (counted as :59 + 1 s, as POSIX time does)
  std::size_t i = 19;
  std::int64_t frac_us = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    const std::size_t start = i;
    std::int64_t scale = 100'000;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      frac_us += (s[i] - '0') * scale;
      scale /= 10;
      ++i;
    }
    if (i == start) return false;
  }
  if (i >= s.size()) return false;
  int offset_min = 0;
  if (s[i] == 'Z' || s[i] == 'z') {
    ++i;
  } else if (s[i] == '+' || s[i] == '-') {
    if (!digits_at(i + 1, 2) || i + 3 >= s.size() || s[i + 3] != ':' || !digits_at(i + 4, 2)) return false;
    const int oh = num(s, i + 1, 2), om = num(s, i + 4, 2);
    if (oh > 23 || om > 59) return false;
    offset_min = (oh * 60 + om) * (s[i] == '-' ? -1 : 1);
    i += 6;
  } else {
    return false;
  }
  if (i != s.size()) return false;
  const std::int64_t secs = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d)) * 86'400 +
                            h * 3600 + mi * 60 + sec - static_cast<std::int64_t>(offset_min) * 60;
  // A leap second only where one can be: 23:59:60 UTC on a month's last day (RFC 3339 §5.7).
  if (sec == 60 && !core::ends_utc_month(secs - 1)) return false;
  us = secs * 1'000'000 + frac_us;
  return true;
}

// Unix seconds, optionally with a fraction: "1764630300", "1764630300.25".
bool parse_unix_seconds(std::string_view s, std::int64_t& us) {
  const auto dot = s.find('.');
  const std::string_view whole = s.substr(0, dot);
  if (!all_digits(whole) || whole.size() > 11) return false;
  std::int64_t secs = 0;
  std::from_chars(whole.data(), whole.data() + whole.size(), secs);
  std::int64_t frac_us = 0;
  if (dot != std::string_view::npos) {
    const std::string_view frac = s.substr(dot + 1);
    if (!all_digits(frac)) return false;
    std::int64_t scale = 100'000;
    for (char c : frac) {
      frac_us += (c - '0') * scale;
      scale /= 10;
    }
  }
  us = secs * 1'000'000 + frac_us;
  return true;
}

bool parse_time(std::string_view s, std::int64_t& us) {
  return s.find('-') != std::string_view::npos ? parse_rfc3339(s, us) : parse_unix_seconds(s, us);
}

bool parse_cursor(std::string_view s, std::int64_t& ts_us, std::int64_t& id) {
  if (s.size() != 32) return false;
  std::uint64_t v[2] = {0, 0};
  for (std::size_t i = 0; i < 32; ++i) {
    const int d = core::hex_value(s[i]);
    if (d < 0 || (s[i] >= 'A' && s[i] <= 'F')) return false;
    v[i / 16] = v[i / 16] << 4 | static_cast<std::uint64_t>(d);
  }
  ts_us = static_cast<std::int64_t>(v[0]);
  id = static_cast<std::int64_t>(v[1]);
  return id > 0;
}

core::Error bad(std::string message, std::string_view param) { return core::bad_request(std::move(message), param); }

// Closes a list answer: `],"has_more":..,"next_cursor":..}`, the cursor from the last row shown.
void finish_list(std::string& out, bool has_more, std::int64_t last_ts, std::int64_t last_id) {
  fmt::format_to(std::back_inserter(out), R"(],"has_more":{},"next_cursor":)", has_more);
  if (has_more) {
    out += '"';
    out += make_cursor(last_ts, last_id);
    out += '"';
  } else {
    out += "null";
  }
  out += '}';
}

// The stored record with the count of the other records that share its
// request id as a member "others_with_id", and its captured bodies (a JSON
// object, or empty for none) as a last member "bodies". The record is a
// JSON object Weir wrote: it ends in '}'.
std::string with_bodies(std::string_view record, std::int64_t others, std::string_view bodies) {
  std::string out(record);
  if (out.empty() || out.back() != '}') return out;
  out.pop_back();
  fmt::format_to(std::back_inserter(out), R"({}"others_with_id":{})", out.size() > 1 ? "," : "", others);
  if (!bodies.empty()) {
    out += R"(,"bodies":)";
    out += bodies;
  }
  out += '}';
  return out;
}

}  // namespace

std::string make_cursor(std::int64_t ts_us, std::int64_t id) {
  return fmt::format("{:016x}{:016x}", static_cast<std::uint64_t>(ts_us), static_cast<std::uint64_t>(id));
}

tl::expected<Query, core::Error> parse_query(std::string_view url_query) {
  Query q;
  // The parameters' names.
  static constexpr std::string_view kNames[] = {"since",      "until",  "tenant", "key_id", "model",
                                                "request_id", "status", "limit",  "cursor"};
  bool seen[std::size(kNames)] = {};
  if (!url_query.empty() && url_query.front() == '?') url_query.remove_prefix(1);
  while (!url_query.empty()) {
    const auto amp = url_query.find('&');
    const std::string_view pair = url_query.substr(0, amp);
    url_query = amp == std::string_view::npos ? std::string_view{} : url_query.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    const std::string name = form_decode(pair.substr(0, eq));
    const std::string value = eq == std::string_view::npos ? std::string() : form_decode(pair.substr(eq + 1));
    std::size_t k = 0;
    while (k < std::size(kNames) && kNames[k] != name) ++k;
    if (k == std::size(kNames))
      return tl::unexpected(bad(fmt::format("Unrecognized query parameter: '{}' (expected since, until, tenant, "
                                            "key_id, model, request_id, status, limit or cursor)",
                                            core::utf8_prefix(name, 64)),
                                // (as sent: a view into the caller's query string, as the error's param must be)
                                core::utf8_prefix(pair.substr(0, eq), 64)));
    const std::string_view param = kNames[k];
    if (seen[k]) return tl::unexpected(bad(fmt::format("'{}' is given more than once", param), param));
    seen[k] = true;
    if (param == "since" || param == "until") {
      std::int64_t us = 0;
      if (!parse_time(value, us))
        return tl::unexpected(
            bad(fmt::format("'{}' must be an RFC 3339 time (2026-12-01T23:05:00Z) or Unix seconds", param), param));
      (param == "since" ? q.since_us : q.until_us) = us;
    } else if (param == "tenant" || param == "key_id" || param == "model" || param == "request_id") {
      if (value.empty()) return tl::unexpected(bad(fmt::format("'{}' must not be empty", param), param));
      (param == "tenant" ? q.tenant : param == "key_id" ? q.key_id : param == "model" ? q.model : q.request_id) = value;
    } else if (param == "status") {
      if (value.size() == 3 && all_digits(value) && value[0] >= '1' && value[0] <= '5') {
        q.status_min = q.status_max = num(value, 0, 3);
      } else if (value.size() == 3 && value[0] >= '1' && value[0] <= '5' && (value[1] == 'x' || value[1] == 'X') &&
                 (value[2] == 'x' || value[2] == 'X')) {
        q.status_min = (value[0] - '0') * 100;
        q.status_max = q.status_min + 99;
      } else {
        return tl::unexpected(bad("'status' must be an HTTP status (100..599) or a class such as 4xx", param));
      }
    } else if (param == "limit") {
      if (!all_digits(value) || value.size() > 4 || num(value, 0, value.size()) < 1 ||
          num(value, 0, value.size()) > 1000)
        return tl::unexpected(bad("'limit' must be an integer from 1 to 1000", param));
      q.limit = static_cast<std::uint32_t>(num(value, 0, value.size()));
    } else {
      std::int64_t ts = 0, id = 0;
      if (!parse_cursor(value, ts, id))
        return tl::unexpected(bad("'cursor' is not a cursor this API returned (next_cursor)", param));
      q.after_ts_us = ts;
      q.after_id = id;
    }
  }
  if (q.since_us && q.until_us && *q.since_us >= *q.until_us)
    return tl::unexpected(bad("'since' must be before 'until'", "since"));
  return q;
}

tl::expected<void, core::Error> Reader::ensure_open() {
  // A file renamed or deleted under the open connection (logrotate, `mv requests.db requests.db.1`): the
  // writer opens a new one at the path (Writer::write_batch); the reader follows, else it would list the old
  // file's rows for good, and read the new file's WAL (at the same name) against the old file's pages. A new
  // file not made yet is a 503, as at start-up. Its -wal deleted or replaced: the writer copies the rows into
  // the file and opens a new log (sqlite_store.cpp, moved()); this connection, on the old one, would read the
  // new log's index against the old log's frames. An immutable connection (prepare()) is left once a -wal
  // is there: a writer has the file open. (One fstat and two stats per query.)
  if (db_ && (db_.has_moved() || db_.wal_replaced() || (immutable_ && wal_exists()))) db_.close();
  if (db_) return {};
  immutable_ = false;
  wal_noted_ = false;
  std::string error;
  if (!db_.open(path_, true, error))
    return tl::unexpected(core::unavailable(fmt::format("the request log store cannot be opened: {}", error)));
  std::string ignored;
  db_.exec("PRAGMA busy_timeout = 2000;", ignored);
  return {};
}

core::Error Reader::read_failed() {
  auto e = core::unavailable(fmt::format("the request log store cannot be read: {}", db_.errmsg()));
  db_.close();  // (a statement still open finalizes it: sqlite3_close_v2) open again next time
  return e;
}

bool Reader::wal_exists() const {
  struct stat st {};
  return ::stat((resolve_links(path_) + "-wal").c_str(), &st) == 0;
}

Stmt Reader::prepare(std::string_view sql, std::string& error) {
  Stmt st = db_.prepare(sql, error);
  if (st) {
    if (!wal_noted_ && !immutable_) db_.note_wal();  // the statement opened the log
    wal_noted_ = true;
    return st;
  }
  // A reader of a WAL-mode file makes PATH-shm (and PATH-wal) beside it when they are not there: in a
  // directory it may not write (a read-only mount, another user's 0755 directory) SQLite says "unable to
  // open database file" or "attempt to write a readonly database", for a file it may read. With no PATH-wal
  // no writer has the file open (the last one checkpointed it and removed the log): the file alone is the
  // whole database, read as immutable (no locks, no -shm).
  const int code = db_.errcode();
  if (!immutable_ && (code == SQLITE_CANTOPEN || code == SQLITE_READONLY)) {
    if (!wal_exists()) {
      std::string why;
      if (db_.open_immutable(path_, why)) {
        immutable_ = true;
        wal_noted_ = true;
        if (Stmt again = db_.prepare(sql, error)) return again;
      }
    } else if (const std::string what = wal_obstacle(path_); !what.empty()) {
      // Not a log a writer left: nothing SQLite can open, whoever reads (its -shm is not the matter).
      error = fmt::format(
          "{} ({}-wal, where SQLite keeps the file's write-ahead log, is {}: remove it, and a running Weir's "
          "writer opens a new log there)",
          error, resolve_links(path_), what);
    } else {
      error = fmt::format(
          "{} (SQLite must create {}-shm beside the file to read it while {}-wal is there, a writer running or one "
          "that did not close it: read it as a user who may write in that directory, or read a copy made with "
          "`sqlite3 {} .backup COPY`)",
          error, path_, path_, path_);
    }
  }
  db_.close();  // a store not created yet, or replaced: open again next time
  return Stmt();
}

tl::expected<std::string, core::Error> Reader::query_json(const Query& q) {
  std::lock_guard lock(mu_);
  if (kind_ == StoreKind::postgres) return query_pg(q);
  if (auto r = ensure_open(); !r) return tl::unexpected(std::move(r.error()));
  std::string sql = "SELECT id, ts_us, record FROM requests WHERE 1";
  if (q.since_us) sql += " AND ts_us >= :since";
  if (q.until_us) sql += " AND ts_us < :until";
  if (q.tenant) sql += " AND tenant = :tenant";
  if (q.key_id) sql += " AND key_id = :key_id";
  if (q.model) sql += " AND model = :model";
  if (q.request_id) sql += " AND request_id = :request_id";
  if (q.status_min) sql += " AND status BETWEEN :smin AND :smax";
  if (q.after_ts_us) sql += " AND (ts_us, id) < (:ats, :aid)";
  sql += " ORDER BY ts_us DESC, id DESC LIMIT :limit";
  std::string error;
  Stmt st = prepare(sql, error);
  if (!st) return tl::unexpected(core::unavailable(fmt::format("the request log store cannot be read: {}", error)));
  int i = 1;
  if (q.since_us) st.bind(i++, *q.since_us);
  if (q.until_us) st.bind(i++, *q.until_us);
  if (q.tenant) st.bind(i++, std::string_view(*q.tenant));
  if (q.key_id) st.bind(i++, std::string_view(*q.key_id));
  if (q.model) st.bind(i++, std::string_view(*q.model));
  if (q.request_id) st.bind(i++, std::string_view(*q.request_id));
  if (q.status_min) {
    st.bind(i++, static_cast<std::int64_t>(q.status_min));
    st.bind(i++, static_cast<std::int64_t>(q.status_max));
  }
  if (q.after_ts_us) {
    st.bind(i++, *q.after_ts_us);
    st.bind(i++, q.after_id);
  }
  st.bind(i++, static_cast<std::int64_t>(q.limit) + 1);  // one more: has_more
  std::string out = R"({"object":"list","data":[)";
  std::uint32_t rows = 0;
  std::int64_t last_ts = 0, last_id = 0;
  bool has_more = false;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    if (rows == q.limit) {
      has_more = true;
      break;
    }
    if (rows++) out += ',';
    last_id = st.column_int64(0);
    last_ts = st.column_int64(1);
    out += st.column_text(2);
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return tl::unexpected(read_failed());
  finish_list(out, has_more, last_ts, last_id);
  return out;
}

tl::expected<std::optional<std::string>, core::Error> Reader::get_json(std::string_view request_id) {
  std::lock_guard lock(mu_);
  if (kind_ == StoreKind::postgres) return get_pg(request_id);
  if (auto r = ensure_open(); !r) return tl::unexpected(std::move(r.error()));
  std::string error;
  // Newest as the list orders (its first row with this request_id is this one); the count before the LIMIT.
  Stmt st = prepare(
      "SELECT record, bodies, COUNT(*) OVER () FROM requests WHERE request_id = ?1 "
      "ORDER BY ts_us DESC, id DESC LIMIT 1",
      error);
  if (!st) return tl::unexpected(core::unavailable(fmt::format("the request log store cannot be read: {}", error)));
  st.bind(1, request_id);
  const int rc = st.step();
  if (rc == SQLITE_ROW)
    return std::optional<std::string>(with_bodies(st.column_text(0), st.column_int64(2) - 1, st.column_text(1)));
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  return tl::unexpected(read_failed());
}

PgResult Reader::exec_pg(const char* sql, const std::vector<const char*>& params, std::string& error) {
  PgResult r = pg_.exec(sql, params);
  if (!r.ok() && pg_ && !pg_.healthy()) {
    // The server had closed the connection while it was idle (a restart, idle_session_timeout,
    // pg_terminate_backend, a pooler): a read runs again on a new one rather than failing.
    const std::string lost = r.error();
    if (!pg_.connect(path_, error)) {
      error = fmt::format("{}; connecting again: {}", lost, error);
      return r;
    }
    r = pg_.exec(sql, params);
  }
  if (!r.ok()) error = r.error();
  return r;
}

namespace {

// A text value the writer could have stored in a PostgreSQL column: valid UTF-8 without NUL. Any other
// matches no row (and is never sent: the server refuses it as a parameter).
bool storable(std::string_view v) { return v.find('\0') == std::string_view::npos && valid_utf8(v); }

}  // namespace

tl::expected<std::string, core::Error> Reader::query_pg(const Query& q) {
  auto unavailable = [&](const std::string& why) {
    pg_.close();  // a server restarted, a network blip: connect again next time
    return tl::unexpected(core::unavailable(fmt::format("the request log store cannot be read: {}", why)));
  };
  std::string error;
  if (!pg_ && !pg_.connect(path_, error)) return unavailable(error);
  // Text parameters, numbered as they are added.
  std::vector<std::string> values;
  std::string sql = "SELECT id, ts_us, record FROM requests WHERE true";
  auto param = [&](std::string v, const char* cast) {
    values.push_back(std::move(v));
    return fmt::format("${}{}", values.size(), cast);
  };
  if (q.since_us) sql += " AND ts_us >= " + param(std::to_string(*q.since_us), "::bigint");
  if (q.until_us) sql += " AND ts_us < " + param(std::to_string(*q.until_us), "::bigint");
  if (q.tenant) sql += " AND tenant = " + param(*q.tenant, "");
  if (q.key_id) sql += " AND key_id = " + param(*q.key_id, "");
  if (q.model) sql += " AND model = " + param(*q.model, "");
  if (q.request_id) sql += " AND request_id = " + param(*q.request_id, "");
  if (q.status_min) {
    sql += " AND status BETWEEN " + param(std::to_string(q.status_min), "::int");
    sql += " AND " + param(std::to_string(q.status_max), "::int");
  }
  if (q.after_ts_us) {
    sql += " AND (ts_us, id) < (" + param(std::to_string(*q.after_ts_us), "::bigint");
    sql += ", " + param(std::to_string(q.after_id), "::bigint") + ")";
  }
  sql += " ORDER BY ts_us DESC, id DESC LIMIT " + param(std::to_string(q.limit + 1), "::bigint");
  std::vector<const char*> params;
  // A filter value with a NUL byte or not valid UTF-8 (%FF) matches no stored row, as on SQLite: the
  // writer stores valid UTF-8 only (make_valid), and PostgreSQL text holds no NUL (the server would refuse
  // the value: "invalid byte sequence for encoding UTF8", a 503 that dropped this connection).
  for (const auto& v : values) {
    if (!storable(v)) return std::string(R"({"object":"list","data":[],"has_more":false,"next_cursor":null})");
    params.push_back(v.c_str());
  }
  PgResult r = exec_pg(sql.c_str(), params, error);
  if (!r.ok()) return unavailable(error);
  std::string out = R"({"object":"list","data":[)";
  const int n = r.rows();
  const bool has_more = n > static_cast<int>(q.limit);
  const int shown = has_more ? static_cast<int>(q.limit) : n;
  for (int i = 0; i < shown; ++i) {
    if (i) out += ',';
    out += r.text(i, 2);
  }
  finish_list(out, has_more, shown ? r.int64(shown - 1, 1) : 0, shown ? r.int64(shown - 1, 0) : 0);
  return out;
}

tl::expected<std::optional<std::string>, core::Error> Reader::get_pg(std::string_view request_id) {
  auto unavailable = [&](const std::string& why) {
    pg_.close();
    return tl::unexpected(core::unavailable(fmt::format("the request log store cannot be read: {}", why)));
  };
  std::string error;
  if (!pg_ && !pg_.connect(path_, error)) return unavailable(error);
  const std::string id(request_id);
  if (!storable(id)) return std::optional<std::string>();  // (no such row: as query_pg's filters)
  PgResult r = exec_pg(
      "SELECT record, bodies, count(*) OVER () FROM requests WHERE request_id = $1 "
      "ORDER BY ts_us DESC, id DESC LIMIT 1",
      {id.c_str()}, error);
  if (!r.ok()) return unavailable(error);
  if (r.rows() == 0) return std::optional<std::string>();
  return std::optional<std::string>(with_bodies(r.text(0, 0), r.int64(0, 2) - 1, r.text(0, 1)));
}

}  // namespace weir::requestlog
