// The request-log store: the per-worker ring, the writer's batches and
// retention against a real SQLite file, and the queries over it.
#include "requestlog/store.hpp"

#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <boost/json.hpp>

#include "core/error.hpp"
#include "requestlog/config.hpp"
#include "requestlog/query.hpp"

namespace weir::requestlog {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/weir-requestlog-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
};

RequestLogConfig config_at(const fs::path& db, std::uint32_t queue = 64, std::uint32_t batch = 16) {
  RequestLogConfig c;
  c.path = db.string();
  c.url = "sqlite:" + c.path;
  c.queue = queue;
  c.batch = batch;
  return c;
}

// Pushes one record; false when the queue was full (and the drop counted).
bool push(RecordQueue& q, std::int64_t ts_us, std::string id, int status = 200, std::string tenant = "t1",
          std::string model = "m") {
  Record* r = q.begin_push();
  if (!r) {
    q.drop();
    return false;
  }
  r->ts_us = ts_us;
  r->status = status;
  r->request_id = id;
  r->tenant = tenant;
  r->key_id = tenant.empty() ? "" : "k-" + tenant;
  r->model = model;
  r->json = fmt::format(R"({{"request_id":"{}","status":{},"ts_us":{}}})", id, status, ts_us);
  q.commit();
  return true;
}

std::int64_t count_rows(const fs::path& db, const char* where = "1") {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  const std::string sql = std::string("SELECT count(*) FROM requests WHERE ") + where;
  EXPECT_EQ(sqlite3_prepare_v2(h, sql.c_str(), -1, &s, nullptr), SQLITE_OK);
  EXPECT_EQ(sqlite3_step(s), SQLITE_ROW);
  const auto n = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(h);
  return n;
}

TEST(RecordQueueTest, FullQueueDropsAndCountsWithoutBlocking) {
  RecordQueue q(4);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(push(q, i, fmt::format("r{}", i)));
  EXPECT_FALSE(push(q, 5, "r5"));
  EXPECT_FALSE(push(q, 6, "r6"));
  EXPECT_EQ(q.dropped(), 2u);
  EXPECT_EQ(q.size(), 4u);
  // FIFO, and a popped slot is free again.
  ASSERT_NE(q.front(), nullptr);
  EXPECT_EQ(q.front()->request_id, "r0");
  q.pop();
  EXPECT_TRUE(push(q, 7, "r7"));
  std::vector<std::string> order;
  while (const Record* r = q.front()) {
    order.push_back(r->request_id);
    q.pop();
  }
  EXPECT_EQ(order, (std::vector<std::string>{"r1", "r2", "r3", "r7"}));
  EXPECT_EQ(q.front(), nullptr);
}

TEST(RecordQueueTest, OneProducerOneConsumerLoseNothingButDrops) {
  RecordQueue q(64);
  constexpr int kN = 200'000;
  std::thread producer([&] {
    for (int i = 0; i < kN; ++i) push(q, i, "x");
  });
  std::int64_t seen = 0, last = -1;
  bool ordered = true;
  while (seen + static_cast<std::int64_t>(q.dropped()) < kN || q.front()) {
    if (const Record* r = q.front()) {
      ordered = ordered && r->ts_us > last && r->request_id == "x";
      last = r->ts_us;
      q.pop();
      ++seen;
    }
  }
  producer.join();
  EXPECT_TRUE(ordered);
  EXPECT_EQ(seen + static_cast<std::int64_t>(q.dropped()), kN);
}

TEST(WriterTest, BatchesInsertsInTransactionsOfAtMostBatch) {
  TempDir dir;
  Writer w(config_at(dir.path / "r.db", 64, 16), 2);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  for (int i = 0; i < 30; ++i) push(w.queue(0), 1000 + i, fmt::format("a{}", i));
  for (int i = 0; i < 10; ++i) push(w.queue(1), 2000 + i, fmt::format("b{}", i));
  EXPECT_EQ(w.write_batch(), 16u);
  EXPECT_EQ(w.transactions(), 1u);
  EXPECT_EQ(count_rows(dir.path / "r.db"), 16);
  std::size_t total = 16;
  while (std::size_t n = w.write_batch()) {
    EXPECT_LE(n, 16u);
    total += n;
  }
  EXPECT_EQ(total, 40u);
  EXPECT_EQ(w.transactions(), 3u);  // 16 + 16 + 8
  EXPECT_EQ(count_rows(dir.path / "r.db"), 40);
  EXPECT_EQ(count_rows(dir.path / "r.db", "tenant = 't1' AND key_id = 'k-t1' AND status = 200"), 40);
  EXPECT_EQ(w.stats().written, 40u);
  EXPECT_EQ(w.stats().queued, 0u);
  // WAL mode.
  EXPECT_TRUE(fs::exists(dir.path / "r.db-wal"));
}

TEST(WriterTest, RetentionByAgeAndByRowCount) {
  TempDir dir;
  auto cfg = config_at(dir.path / "r.db", 4096, 256);
  cfg.max_age = 1000ms;
  cfg.max_rows = 100;
  Writer w(cfg, 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  const std::int64_t now = 10'000'000'000;
  // 50 rows older than max_age, 150 fresh.
  for (int i = 0; i < 50; ++i) push(w.queue(0), now - 2'000'000 + i, fmt::format("old{}", i));
  for (int i = 0; i < 150; ++i) push(w.queue(0), now - 500'000 + i, fmt::format("new{}", i));
  while (w.write_batch()) {
  }
  ASSERT_EQ(count_rows(dir.path / "r.db"), 200);
  w.apply_retention(now);
  EXPECT_EQ(count_rows(dir.path / "r.db"), 100);
  EXPECT_EQ(count_rows(dir.path / "r.db", "request_id LIKE 'old%'"), 0);
  // The newest 100 remain.
  EXPECT_EQ(count_rows(dir.path / "r.db", "request_id IN ('new149', 'new50')"), 2);
  EXPECT_EQ(count_rows(dir.path / "r.db", "request_id = 'new49'"), 0);
  EXPECT_EQ(w.stats().deleted, 100u);
}

TEST(WriterTest, ThreadWritesAndDrainsOnStop) {
  TempDir dir;
  auto cfg = config_at(dir.path / "r.db", 1024, 64);
  cfg.flush_interval = 5ms;
  auto w = std::make_unique<Writer>(cfg, 2);
  w->start();
  // Recent records (retention runs on the thread's first pass: max_age 7d must keep them).
  const std::int64_t now_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  for (int i = 0; i < 500; ++i) ASSERT_TRUE(push(w->queue(i % 2), now_us + i, fmt::format("r{}", i)));
  // The drain ends once the queues are empty: the deadline only bounds a broken one (tests at SCHED_IDLE
  // beside other jobs wait seconds for a core). A drain left running keeps its writer, as server.cpp does:
  // destroyed under it, it is a use after free.
  if (!w->stop(std::chrono::steady_clock::now() + 60s)) {
    (void)w.release();
    FAIL() << "the drain did not end by its deadline";
  }
  EXPECT_EQ(w->stats().written, 500u);
  EXPECT_EQ(w->stats().dropped_shutdown, 0u);
  EXPECT_EQ(w->stats().deleted, 0u);
  EXPECT_EQ(count_rows(dir.path / "r.db"), 500);
}

TEST(WriterTest, UnwritableStoreCountsErrorsAndDropsWithoutBlocking) {
  TempDir dir;
  // A path SQLite cannot open for writing, whoever runs the test: a directory.
  fs::create_directory(dir.path / "r.db");
  auto cfg = config_at(dir.path / "r.db", 8, 4);
  auto w = std::make_unique<Writer>(cfg, 1);
  w->start();  // not fatal
  EXPECT_FALSE(w->stats().open);
  EXPECT_GE(w->stats().errors, 1u);
  int pushed = 0;
  for (int i = 0; i < 20; ++i) pushed += push(w->queue(0), i, "x");
  EXPECT_EQ(pushed, 8);  // records wait while the store is closed, then drop
  EXPECT_EQ(w->stats().dropped_queue_full, 12u);
  // (The drain drops them at once, the store not opening: the deadline bounds only a broken drain; one left
  // running keeps its writer, as server.cpp does.)
  if (!w->stop(std::chrono::steady_clock::now() + 60s)) {
    (void)w.release();
    FAIL() << "the drain did not end by its deadline";
  }
  EXPECT_EQ(w->stats().written, 0u);
  EXPECT_EQ(w->stats().dropped_shutdown, 8u);
}

TEST(WriterTest, CapturedBodiesAreRedactedAndStoredAsJson) {
  TempDir dir;
  Writer w(config_at(dir.path / "r.db"), 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  Record* r = w.queue(0).begin_push();
  ASSERT_NE(r, nullptr);
  r->ts_us = 1;
  r->status = 200;
  r->request_id = "with-bodies";
  r->json = R"({"request_id":"with-bodies"})";
  r->request_body = {.present = true,
                     .truncated = false,
                     .size = 60,
                     .bytes = R"({"prompt":"key sk-proj-abcdefghijklmnopqrst here","api_key":"hunter2"})"};
  r->response_body = {.present = true, .truncated = true, .size = 9000, .bytes = std::string("\xff\xfe\x00z", 4)};
  w.queue(0).commit();
  ASSERT_EQ(w.write_batch(), 1u);
  Reader reader((dir.path / "r.db").string());
  auto one = reader.get_json("with-bodies");
  ASSERT_TRUE(one && *one);
  const auto v = boost::json::parse(**one).as_object();
  EXPECT_EQ(v.at("request_id").as_string(), "with-bodies");
  const auto& req = v.at("bodies").at("request").as_object();
  EXPECT_EQ(req.at("text").as_string(), R"({"prompt":"key [REDACTED] here","api_key":"[REDACTED]"})");
  EXPECT_EQ(req.at("size").as_int64(), 60);
  EXPECT_FALSE(req.at("truncated").as_bool());
  const auto& res = v.at("bodies").at("response").as_object();
  EXPECT_EQ(res.at("base64").as_string(), "//4Aeg==");
  EXPECT_TRUE(res.at("truncated").as_bool());
  // The ring's slot forgets the bodies once stored.
  EXPECT_TRUE(r->request_body.bytes.empty());
}

TEST(WriterTest, QueuedBodiesAreBoundedPerWorker) {
  TempDir dir;
  Writer w(config_at(dir.path / "r.db", 1024, 1024), 1);
  BodyBudget& b = w.body_budget(0);
  const std::int64_t body = 1 << 20;
  int kept = 0;
  for (int i = 0; i < 40; ++i) kept += b.take(body);
  EXPECT_EQ(kept, 32);  // 32 MiB
  EXPECT_EQ(w.stats().bodies_dropped, 8u);
  // The writer gives back what it stored: bodies are kept again.
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  Record* r = w.queue(0).begin_push();
  ASSERT_NE(r, nullptr);
  r->ts_us = 1;
  r->request_id = "x";
  r->json = "{}";
  r->request_body = {.present = true, .truncated = false, .size = 5, .bytes = "hello"};
  w.queue(0).commit();
  b.give(32 * body - 5);  // as if the 32 bodies left; the queued record's 5 bytes remain
  EXPECT_EQ(b.queued.load(), 5);
  ASSERT_EQ(w.write_batch(), 1u);
  EXPECT_EQ(b.queued.load(), 0);
  EXPECT_TRUE(b.take(body));
}

TEST(WriterTest, ASlotKeepsAUsualRecordsTextNotTheLargestOnes) {
  // Every slot of the ring gets used, and what it keeps stays resident: a stored record's long line and
  // columns (a client's 256-byte model name of control characters escapes to a 2 KiB line) are given back,
  // a usual one's capacity is kept (no allocation for the next record).
  TempDir dir;
  Writer w(config_at(dir.path / "r.db", 4, 16), 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  for (int i = 0; i < 4; ++i) {
    Record* r = w.queue(0).begin_push();
    ASSERT_NE(r, nullptr);
    r->ts_us = 1000 + i;
    r->status = 404;
    r->request_id = fmt::format("long{}", i);
    r->model = std::string(300, 'm');
    r->json = std::string(2048, 'x');
    w.queue(0).commit();
  }
  EXPECT_EQ(w.write_batch(), 4u);
  for (int i = 0; i < 4; ++i) {
    Record* r = w.queue(0).begin_push();
    ASSERT_NE(r, nullptr);
    EXPECT_LE(r->model.capacity(), 128u) << i;
    EXPECT_LE(r->json.capacity(), 1024u) << i;
    r->ts_us = 2000 + i;
    r->request_id = fmt::format("short{}", i);
    r->model = "m";
    r->json = std::string(600, 'x');
    w.queue(0).commit();
    EXPECT_EQ(w.write_batch(), 1u);
  }
  for (int i = 0; i < 4; ++i) {  // a usual line's capacity stays
    Record* r = w.queue(0).begin_push();
    ASSERT_NE(r, nullptr);
    EXPECT_GE(r->json.capacity(), 600u) << i;
    r->ts_us = 3000 + i;
    w.queue(0).commit();
    EXPECT_EQ(w.write_batch(), 1u);
  }
  EXPECT_EQ(count_rows(dir.path / "r.db"), 12);
}

TEST(WriterTest, AVersion1StoreGetsTheBodiesColumn) {
  TempDir dir;
  const auto db = dir.path / "r.db";
  {
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h,
                           "CREATE TABLE requests (id INTEGER PRIMARY KEY, ts_us INTEGER NOT NULL, request_id TEXT "
                           "NOT NULL, tenant TEXT, key_id TEXT, model TEXT, status INTEGER NOT NULL, record TEXT NOT "
                           "NULL); INSERT INTO requests (ts_us, request_id, status, record) VALUES (1, 'old', 200, "
                           "'{\"request_id\":\"old\"}'); PRAGMA user_version = 1;",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(h);
  }
  Writer w(config_at(db), 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  push(w.queue(0), 2, "new");
  ASSERT_EQ(w.write_batch(), 1u);
  EXPECT_EQ(count_rows(db), 2);
  EXPECT_EQ(count_rows(db, "bodies IS NULL"), 2);
  Reader reader(db.string());
  auto old = reader.get_json("old");
  ASSERT_TRUE(old && *old);
  EXPECT_EQ(**old, R"({"request_id":"old","others_with_id":0})");
}

// The names of the indexes on `requests`, sorted.
std::vector<std::string> index_names(const fs::path& db) {
  sqlite3* h = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(h,
                               "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'requests' AND "
                               "sql IS NOT NULL ORDER BY name",
                               -1, &s, nullptr),
            SQLITE_OK);
  std::vector<std::string> out;
  while (sqlite3_step(s) == SQLITE_ROW) out.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)));
  sqlite3_finalize(s);
  sqlite3_close(h);
  return out;
}

TEST(WriterTest, AVersion2StoreGetsOneTimeIndexInPlaceOfOnePerFilter) {
  TempDir dir;
  const auto db = dir.path / "r.db";
  {
    Writer w(config_at(db), 1);
    std::string err;
    ASSERT_TRUE(w.open_store(err)) << err;
    push(w.queue(0), 1, "before");
    ASSERT_EQ(w.write_batch(), 1u);
  }
  EXPECT_EQ(index_names(db), (std::vector<std::string>{"requests_request_id", "requests_time"}));
  {  // what a Weir of schema 2 made
    sqlite3* h = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h,
                           "DROP INDEX requests_time; CREATE INDEX requests_ts ON requests (ts_us, id); CREATE INDEX "
                           "requests_tenant ON requests (tenant, ts_us, id); CREATE INDEX requests_key_id ON requests "
                           "(key_id, ts_us, id); CREATE INDEX requests_model ON requests (model, ts_us, id); CREATE "
                           "INDEX requests_status ON requests (status, ts_us, id); PRAGMA user_version = 2;",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(h);
  }
  Writer w(config_at(db), 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  EXPECT_EQ(index_names(db), (std::vector<std::string>{"requests_request_id", "requests_time"}));
  push(w.queue(0), 1, "after");
  ASSERT_EQ(w.write_batch(), 1u);
  EXPECT_EQ(count_rows(db), 2);
}

TEST(Utf8Test, EveryPositionOfALongStringIsChecked) {
  // The word-at-a-time ASCII scan must not skip a bad byte, nor split a
  // good sequence, wherever it falls against the 8-byte words.
  for (std::size_t len = 1; len <= 40; ++len)
    for (std::size_t at = 0; at < len; ++at) {
      std::string s(len, 'a');
      s[at] = '\xff';
      EXPECT_FALSE(valid_utf8(s)) << len << " " << at;
      s[at] = '\x80';  // a continuation byte alone
      EXPECT_FALSE(valid_utf8(s)) << len << " " << at;
      if (at + 3 <= len) {
        s.replace(at, 3, "\xe2\x82\xac");  // U+20AC, three bytes
        EXPECT_TRUE(valid_utf8(s)) << len << " " << at;
        if (at + 3 < len) {
          s[at + 3] = '\xbf';  // one continuation byte too many
          EXPECT_FALSE(valid_utf8(s)) << len << " " << at;
        }
      }
      if (at + 2 == len) {
        s.replace(at, 2, "\xe2\x82");  // truncated at the end
        EXPECT_FALSE(valid_utf8(s)) << len << " " << at;
      }
    }
}

TEST(WriterTest, InvalidUtf8ColumnsAreStoredValid) {
  TempDir dir;
  Writer w(config_at(dir.path / "r.db"), 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  push(w.queue(0), 1, "id", 200, "t1", "bad\xff\xfemodel");
  // A truncated emoji is one ill-formed sequence: one U+FFFD, as the access log's line writes it (it was one
  // per byte, three, and no filter by the value the log showed found the row).
  push(w.queue(0), 2, "id2", 200, "t1", "cut\xf0\x9f\x98");
  ASSERT_EQ(w.write_batch(), 2u);
  EXPECT_EQ(count_rows(dir.path / "r.db", "model = 'bad' || char(65533) || char(65533) || 'model'"), 1);
  EXPECT_EQ(count_rows(dir.path / "r.db", "model = 'cut' || char(65533)"), 1);
  EXPECT_TRUE(valid_utf8("h\xc3\xa9llo"));
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(valid_utf8("\xc3"));
}

// --- queries ---

struct Filled {
  TempDir dir;
  fs::path db;
  std::vector<std::string> ids_newest_first;
};

// 250 rows: 5 per millisecond (ties in time), tenants t0..t2, statuses 200/429/502.
void fill(Filled& f) {
  f.db = f.dir.path / "r.db";
  Writer w(config_at(f.db, 512, 64), 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  for (int i = 0; i < 250; ++i) {
    const int status = i % 10 == 0 ? 429 : i % 25 == 0 ? 502 : 200;
    push(w.queue(0), 1'764'630'000'000'000 + (i / 5) * 1000, fmt::format("req-{:03}", i), status,
         fmt::format("t{}", i % 3), i % 2 ? "llama" : "qwen");
  }
  while (w.write_batch()) {
  }
  for (int i = 249; i >= 0; --i) f.ids_newest_first.push_back(fmt::format("req-{:03}", i));
}

std::vector<std::string> ids_of(const std::string& json, bool& has_more, std::string& cursor) {
  auto v = boost::json::parse(json).as_object();
  EXPECT_EQ(v["object"].as_string(), "list");
  has_more = v["has_more"].as_bool();
  cursor = v["next_cursor"].is_null() ? "" : std::string(v["next_cursor"].as_string());
  std::vector<std::string> ids;
  for (const auto& r : v["data"].as_array()) ids.emplace_back(r.as_object().at("request_id").as_string());
  return ids;
}

TEST(ReaderTest, KeysetPagesCoverEveryRowOnceNewestFirstWithTies) {
  Filled f;
  fill(f);
  Reader reader(f.db.string());
  std::vector<std::string> all;
  std::string cursor;
  int pages = 0;
  for (;;) {
    auto q = parse_query("limit=7" + (cursor.empty() ? "" : "&cursor=" + cursor));
    ASSERT_TRUE(q) << q.error().message;
    auto page = reader.query_json(*q);
    ASSERT_TRUE(page) << page.error().message;
    bool more = false;
    auto ids = ids_of(*page, more, cursor);
    EXPECT_LE(ids.size(), 7u);
    all.insert(all.end(), ids.begin(), ids.end());
    ++pages;
    if (!more) {
      EXPECT_TRUE(cursor.empty());
      break;
    }
    ASSERT_FALSE(cursor.empty());
  }
  EXPECT_EQ(pages, 36);  // 250 / 7 rounded up
  EXPECT_EQ(all, f.ids_newest_first);
}

TEST(ReaderTest, Filters) {
  Filled f;
  fill(f);
  Reader reader(f.db.string());
  auto run = [&](const std::string& qs) {
    auto q = parse_query(qs);
    EXPECT_TRUE(q) << q.error().message;
    auto page = reader.query_json(*q);
    EXPECT_TRUE(page) << page.error().message;
    bool more;
    std::string cursor;
    return ids_of(*page, more, cursor);
  };
  EXPECT_EQ(run("status=429&limit=1000").size(), 25u);
  EXPECT_EQ(run("status=5xx&limit=1000").size(), 5u);  // 25, 75, ..., 225
  EXPECT_EQ(run("tenant=t1&limit=1000").size(), 83u);
  EXPECT_EQ(run("tenant=t1&model=llama&limit=1000").size(), 42u);
  EXPECT_EQ(run("key_id=k-t2&limit=1000").size(), 83u);
  EXPECT_EQ(run("tenant=nobody").size(), 0u);
  // since inclusive, until exclusive: rows 5..9 share the millisecond 1764630000.001.
  EXPECT_EQ(run("since=2025-12-01T23:00:00.001Z&until=2025-12-01T23:00:00.002Z"),
            (std::vector<std::string>{"req-009", "req-008", "req-007", "req-006", "req-005"}));
  EXPECT_EQ(run("since=1764630000.049&limit=1000").size(), 5u);
  EXPECT_EQ(run("since=2025-12-02T00:00:00.049%2B01:00&limit=1000").size(), 5u);
  EXPECT_EQ(run("").size(), 50u);  // the default limit
}

TEST(ReaderTest, GetById) {
  Filled f;
  fill(f);
  Reader reader(f.db.string());
  auto one = reader.get_json("req-042");
  ASSERT_TRUE(one);
  ASSERT_TRUE(one->has_value());
  EXPECT_EQ(boost::json::parse(**one).as_object().at("request_id").as_string(), "req-042");
  auto none = reader.get_json("req-999");
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
}

// Clients choose their x-request-id: two tenants' requests may share one. The record by id is the newest
// (as the list orders) and says how many others have the id; the list's request_id filter gives them all.
TEST(ReaderTest, ARequestIdSharedByTenantsHidesNoRecord) {
  TempDir dir;
  const auto db = dir.path / "r.db";
  Writer w(config_at(db), 1);
  std::string err;
  ASSERT_TRUE(w.open_store(err)) << err;
  // Inserted out of time order (workers' lines reach the writer so): ts decides what is newest.
  push(w.queue(0), 3000, "same", 200, "acme");
  push(w.queue(0), 1000, "same", 500, "globex");
  push(w.queue(0), 2000, "same", 429, "initech");
  push(w.queue(0), 4000, "other", 200, "acme");
  while (w.write_batch()) {
  }
  Reader reader(db.string());
  auto one = reader.get_json("same");
  ASSERT_TRUE(one && *one);
  auto v = boost::json::parse(**one).as_object();
  EXPECT_EQ(v.at("ts_us").as_int64(), 3000);
  EXPECT_EQ(v.at("others_with_id").as_int64(), 2);
  auto alone = reader.get_json("other");
  ASSERT_TRUE(alone && *alone);
  EXPECT_EQ(boost::json::parse(**alone).as_object().at("others_with_id").as_int64(), 0);
  auto q = parse_query("request_id=same");
  ASSERT_TRUE(q) << q.error().message;
  auto page = reader.query_json(*q);
  ASSERT_TRUE(page) << page.error().message;
  std::vector<std::int64_t> ts;
  const auto list = boost::json::parse(*page);
  for (const auto& r : list.as_object().at("data").as_array()) ts.push_back(r.as_object().at("ts_us").as_int64());
  EXPECT_EQ(ts, (std::vector<std::int64_t>{3000, 2000, 1000}));
  // With the other filters, as any.
  q = parse_query("request_id=same&status=5xx");
  ASSERT_TRUE(q);
  page = reader.query_json(*q);
  ASSERT_TRUE(page);
  EXPECT_EQ(boost::json::parse(*page).as_object().at("data").as_array().size(), 1u);
}

// The -wal removed under an open writer and reader (an operator's rm): SQLite writes on into the unlinked log, whose
// rows would be lost when a read-only connection closes last, or at a crash. The writer notices (a stat, at most
// once a second), checkpoints them into the file and opens a new log; the reader follows it.
TEST(WriterTest, ARemovedWalIsCheckpointedIntoTheFileAndANewOneOpened) {
  TempDir dir;
  const auto db = dir.path / "r.db";
  std::optional<Reader> reader(std::in_place, db.string());
  auto q = parse_query("limit=1000");
  ASSERT_TRUE(q);
  auto listed = [&] {
    auto page = reader->query_json(*q);
    EXPECT_TRUE(page) << page.error().message;
    bool more;
    std::string cursor;
    return page ? ids_of(*page, more, cursor).size() : 0u;
  };
  {
    Writer w(config_at(db), 1);
    std::string err;
    ASSERT_TRUE(w.open_store(err)) << err;
    for (int i = 0; i < 10; ++i) push(w.queue(0), 1000 + i, fmt::format("before{}", i));
    while (w.write_batch()) {
    }
    EXPECT_EQ(listed(), 10u);  // the reader has the log open
    fs::remove(db.string() + "-wal");
    for (int i = 0; i < 10; ++i) push(w.queue(0), 2000 + i, fmt::format("during{}", i));
    // Noticed before a batch, a stat at most once a second.
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (w.stats().errors == 0 && std::chrono::steady_clock::now() < give_up) {
      w.write_batch();
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(w.stats().errors, 1u);
    EXPECT_TRUE(w.stats().open);
    EXPECT_TRUE(fs::exists(db.string() + "-wal"));  // a new log
    for (int i = 0; i < 10; ++i) push(w.queue(0), 3000 + i, fmt::format("after{}", i));
    while (w.write_batch()) {
    }
    EXPECT_EQ(w.stats().written, 30u);
    EXPECT_EQ(listed(), 30u);
  }                // the writer closes first: not the last connection, it leaves the log as it is
  reader.reset();  // the last, read-only: it cannot checkpoint
  EXPECT_EQ(count_rows(db), 30);
}

TEST(ReaderTest, MissingStoreIs503) {
  TempDir dir;
  Reader reader((dir.path / "none.db").string());
  auto r = reader.get_json("x");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().status, 503);
}

TEST(ParseQueryTest, Defaults) {
  auto q = parse_query("");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->limit, 50u);
  EXPECT_FALSE(q->since_us || q->until_us || q->tenant || q->key_id || q->model || q->after_ts_us);
  EXPECT_EQ(q->status_min, 0);
}

TEST(ParseQueryTest, ValuesAndDecoding) {
  auto q = parse_query(
      "?tenant=team%20c&model=meta-llama%2FLlama-3.1-8B&key_id=a+b&status=4xx&limit=1000&"
      "since=1970-01-01T00:00:01.5Z&until=2026-12-01T23:05:00-02:30");
  ASSERT_TRUE(q) << q.error().message;
  EXPECT_EQ(*q->tenant, "team c");
  EXPECT_EQ(*q->model, "meta-llama/Llama-3.1-8B");
  EXPECT_EQ(*q->key_id, "a b");
  EXPECT_EQ(q->status_min, 400);
  EXPECT_EQ(q->status_max, 499);
  EXPECT_EQ(q->limit, 1000u);
  EXPECT_EQ(*q->since_us, 1'500'000);
  // 2026-12-02T01:35:00Z
  EXPECT_EQ(*q->until_us, 1'796'175'300LL * 1'000'000);
  // A leap second (23:59:60 UTC at a month's end) is the next day's first second, as POSIX counts it.
  auto leap = parse_query("since=2016-12-31T18:59:60-05:00");
  ASSERT_TRUE(leap) << leap.error().message;
  EXPECT_EQ(*leap->since_us, 1'483'228'800LL * 1'000'000);
  auto u = parse_query("since=0&until=1796175300");
  ASSERT_TRUE(u);
  EXPECT_EQ(*u->since_us, 0);
  EXPECT_EQ(*u->until_us, 1'796'175'300LL * 1'000'000);
  auto c = parse_query("cursor=" + make_cursor(1'764'630'000'123'000, 42));
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->after_ts_us, 1'764'630'000'123'000);
  EXPECT_EQ(c->after_id, 42);
}

TEST(ParseQueryTest, BadInputNamesTheParam) {
  struct Case {
    const char* qs;
    const char* param;  // "" = null
  };
  for (Case c : {Case{"limit=0", "limit"},
                 Case{"limit=1001", "limit"},
                 Case{"limit=abc", "limit"},
                 Case{"limit=", "limit"},
                 Case{"limit=-1", "limit"},
                 Case{"since=yesterday", "since"},
                 Case{"since=2026-13-01T00:00:00Z", "since"},
                 Case{"since=2026-02-29T00:00:00Z", "since"},
                 Case{"since=2026-12-01T24:00:00Z", "since"},
                 Case{"since=2026-12-01T23:00:00", "since"},
                 Case{"since=2026-12-01T23:00:60Z", "since"},  // a leap second only ends a month (UTC)
                 Case{"until=2016-12-31T23:59:60%2B01:00", "until"},
                 Case{"until=2026-12-01", "until"},
                 Case{"until=1.2.3", "until"},
                 Case{"status=200x", "status"},
                 Case{"status=600", "status"},
                 Case{"status=6xx", "status"},
                 Case{"status=", "status"},
                 Case{"tenant=", "tenant"},
                 Case{"request_id=", "request_id"},
                 Case{"cursor=zz", "cursor"},
                 Case{"cursor=%20", "cursor"},
                 Case{"cursor=00000000000000000000000000000000", "cursor"},
                 Case{"limit=5&limit=6", "limit"},
                 Case{"since=200&until=100", "since"},
                 Case{"sinse=1", "sinse"}}) {
    auto q = parse_query(c.qs);
    ASSERT_FALSE(q) << c.qs;
    EXPECT_EQ(q.error().status, 400) << c.qs;
    EXPECT_EQ(q.error().type, "invalid_request_error") << c.qs;
    EXPECT_EQ(q.error().param, c.param) << c.qs;
    // OpenAI's shape with `param`.
    auto body = boost::json::parse(core::error_json(q.error())).as_object();
    EXPECT_TRUE(body.at("error").as_object().contains("param")) << c.qs;
  }
  EXPECT_TRUE(parse_query("since=2024-02-29T00:00:00Z"));  // a leap day
}

TEST(RequestLogConfigTest, ParsesAndChecks) {
  TempDir dir;
  auto parse = [&](const std::string& yaml) { return parse_request_log_config(YAML::Load(yaml), "weir.yaml"); };
  auto none = parse("pools: {}\n");
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
  auto full =
      parse(fmt::format("request_log: {{url: 'sqlite:{}/r.db', queue: 1024, batch: 64, flush_interval: 20ms, "
                        "retention: {{max_age: 7d, max_rows: 5000, interval: 10s}}, priority: normal}}\n",
                        dir.path.string()));
  ASSERT_TRUE(full) << full.error().to_string();
  const auto& c = **full;
  EXPECT_EQ(c.path, (dir.path / "r.db").string());
  EXPECT_EQ(c.queue, 1024u);
  EXPECT_EQ(c.batch, 64u);
  EXPECT_EQ(c.flush_interval, 20ms);
  EXPECT_EQ(c.max_age, std::chrono::hours(24 * 7));
  EXPECT_EQ(c.max_rows, 5000u);
  EXPECT_EQ(c.retention_interval, 10s);
  EXPECT_EQ(c.priority, core::BatchThread::Priority::normal);
  auto defaults = parse(fmt::format("request_log: {{url: 'sqlite:{}/r.db'}}\n", dir.path.string()));
  ASSERT_TRUE(defaults);
  EXPECT_EQ((*defaults)->queue, 4096u);
  EXPECT_EQ((*defaults)->batch, 256u);
  EXPECT_EQ((*defaults)->flush_interval, 100ms);
  EXPECT_EQ((*defaults)->max_rows, 1'000'000u);
  EXPECT_EQ((*defaults)->priority, core::BatchThread::Priority::idle);
  auto error = [&](const std::string& yaml) {
    auto r = parse(yaml);
    return r ? std::string("ok") : r.error().to_string();
  };
  EXPECT_EQ(error("request_log: {url: 'sqlite:/nonexistent-dir/r.db'}\n"),
            "weir.yaml:1:20: request_log.url: directory \"/nonexistent-dir\" does not exist");
  auto pg = parse("request_log: {url: 'postgres://weir:pw@db:5432/weir?sslmode=require'}\n");
  ASSERT_TRUE(pg) << pg.error().to_string();
  EXPECT_EQ((*pg)->kind, StoreKind::postgres);
  EXPECT_EQ((*pg)->url, "postgres://weir:pw@db:5432/weir?sslmode=require");
  EXPECT_EQ((*pg)->display.find("pw"), std::string::npos);  // never shown with its password
  EXPECT_TRUE(parse("request_log: {url: 'postgresql://db/weir'}\n"));
  EXPECT_EQ(error("request_log: {url: 'postgres://db/we ir'}\n"),
            "weir.yaml:1:20: request_log.url: the URL must not hold spaces or line breaks");
  EXPECT_EQ(error("request_log: {url: 'mysql://x'}\n"),
            "weir.yaml:1:20: request_log.url: expected sqlite:/path/requests.db or postgres://user@host/db");
  EXPECT_EQ(error("request_log: {queue: 5}\n"),
            "weir.yaml:1:14: request_log.url: missing (sqlite:/path/requests.db or postgres://user@host/db)");
  // capture_bodies
  auto cap =
      parse(fmt::format("request_log: {{url: 'sqlite:{}/r.db', capture_bodies: {{tenants: [acme, beta], "
                        "max_request_bytes: 4KiB, max_response_bytes: 100}}}}\n",
                        dir.path.string()));
  ASSERT_TRUE(cap) << cap.error().to_string();
  ASSERT_TRUE((*cap)->capture);
  EXPECT_EQ((*cap)->capture->max_request_bytes, 4096u);
  EXPECT_EQ((*cap)->capture->max_response_bytes, 100u);
  EXPECT_TRUE((*cap)->capture->captures("beta"));
  EXPECT_FALSE((*cap)->capture->captures("gamma"));
  auto all = parse(
      fmt::format("request_log: {{url: 'sqlite:{}/r.db', capture_bodies: {{tenants: ['*']}}}}\n", dir.path.string()));
  ASSERT_TRUE(all);
  EXPECT_TRUE((*all)->capture->captures("anyone"));
  EXPECT_EQ((*all)->capture->max_request_bytes, 16384u);
  EXPECT_NE(
      error(fmt::format("request_log: {{url: 'sqlite:{}/r.db', capture_bodies: {{tenants: []}}}}\n", dir.path.string()))
          .find("request_log.capture_bodies.tenants"),
      std::string::npos);
  EXPECT_NE(error(fmt::format("request_log: {{url: 'sqlite:{}/r.db', capture_bodies: {{tenants: [a], "
                              "max_request_bytes: 0}}}}\n",
                              dir.path.string()))
                .find("request_log.capture_bodies.max_request_bytes"),
            std::string::npos);
  EXPECT_NE(error(fmt::format("request_log: {{url: 'sqlite:{}/r.db', batchh: 1}}\n", dir.path.string())), "ok");
  EXPECT_NE(error(fmt::format("request_log: {{url: 'sqlite:{}/r.db', queue: 1}}\n", dir.path.string())), "ok");
  EXPECT_NE(error(fmt::format("request_log: {{url: 'sqlite:{}/r.db', priority: high}}\n", dir.path.string()))
                .find(": request_log.priority: expected idle or normal"),
            std::string::npos);
}

}  // namespace
}  // namespace weir::requestlog
