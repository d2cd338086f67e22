// store::Client against a real redis-server on a free port: commands,
// pipelining, timeouts, reconnect after a restart, NOSCRIPT fallback.
#include "store/redis_client.hpp"

#include <algorithm>

#include <gtest/gtest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "redis_server.hpp"
#include "store/resp.hpp"

namespace weir::store {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, Executor>;
constexpr auto use_task = asio::as_tuple(asio::use_awaitable_t<Executor>{});

Task<void> sleep_for(std::chrono::milliseconds d) {
  Timer t(co_await asio::this_coro::executor);
  t.expires_after(d);
  co_await t.async_wait(use_task);
}

// Runs the coroutine `f()` on `ioc` in this thread until it finishes (at most `limit`).
template <class F>
void run(asio::io_context& ioc, F f, std::chrono::seconds limit = 30s) {
  bool done = false;
  std::exception_ptr err;
  asio::co_spawn(ioc, f(), [&](std::exception_ptr e) {
    err = e;
    done = true;
  });
  const auto deadline = Clock::now() + limit;
  while (!done && Clock::now() < deadline) ioc.run_one_for(50ms);
  ASSERT_TRUE(done) << "test coroutine did not finish in time";
  if (err) std::rethrow_exception(err);
}

// Waits (polling, bounded) until exec(PING) succeeds.
Task<bool> until_up(Client& c, std::chrono::milliseconds limit = 10000ms) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    auto r = co_await c.exec(Command{"PING"});
    if (r) co_return true;
    co_await sleep_for(10ms);
  }
  co_return false;
}

ClientOptions options(const testing::RedisServer& s) {
  ClientOptions o;
  o.port = s.port();
  o.command_timeout = 1000ms;
  o.connect_timeout = 1000ms;
  o.reconnect_min = 10ms;
  o.reconnect_max = 100ms;
  return o;
}

TEST(RespTest, FormatsCommandsAsRespArrays) {
  Command c{"SET", "k", "a b"};
  EXPECT_EQ(c.bytes(), "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\na b\r\n");
  const std::string bin("x\0y", 3);
  Command d{"SET", "k", std::string_view(bin)};
  EXPECT_EQ(d.bytes(), std::string("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nx\0y\r\n", 29));
  Script s("return 1");
  EXPECT_EQ(s.sha1(), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");  // sha1("return 1")
  const std::string keys[] = {"a"};
  const std::string args[] = {"1", "2"};
  auto e = Command::evalsha(s, keys, args);
  EXPECT_EQ(e.script(), &s);
  EXPECT_EQ(e.bytes(),
            "*6\r\n$7\r\nEVALSHA\r\n$40\r\n" + s.sha1() + "\r\n$1\r\n1\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\n2\r\n");
}

TEST(RespTest, ParsesRepliesSplitAcrossReads) {
  ReplyParser p;
  const std::string wire = "+OK\r\n:42\r\n$-1\r\n*2\r\n$3\r\nfoo\r\n:-7\r\n-ERR boom\r\n$5\r\nhello\r\n";
  std::vector<Result<Reply>> got;
  bool bad = false;
  for (char ch : wire) {  // one byte at a time: every split point
    ASSERT_TRUE(p.feed(&ch, 1));
    Result<Reply> r;
    while (p.next(r, &bad)) got.push_back(std::move(r));
    ASSERT_FALSE(bad);
  }
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[0]->type, Reply::Type::status);
  EXPECT_EQ(got[0]->str, "OK");
  EXPECT_EQ(got[1]->integer, 42);
  EXPECT_TRUE(got[2]->is_nil());
  ASSERT_EQ(got[3]->elements.size(), 2u);
  EXPECT_EQ(got[3]->elements[0].str, "foo");
  EXPECT_EQ(got[3]->elements[1].as_int(), -7);
  ASSERT_FALSE(got[4]);
  EXPECT_EQ(got[4].error().code, Errc::server);
  EXPECT_EQ(got[4].error().message, "ERR boom");
  EXPECT_EQ(got[5]->str, "hello");
  EXPECT_EQ(got[5]->as_int(-1), -1);
}

TEST(RespTest, RejectsBytesThatAreNotResp) {
  ReplyParser p;
  ASSERT_TRUE(p.feed("?what\r\n", 7));
  Result<Reply> r;
  bool bad = false;
  EXPECT_FALSE(p.next(r, &bad));
  EXPECT_TRUE(bad);
}

TEST(RespTest, GlobLiteralEscapesEveryPatternCharacter) {
  EXPECT_EQ(glob_literal("weir:"), "weir:");
  EXPECT_EQ(glob_literal("app?:"), "app\\?:");
  EXPECT_EQ(glob_literal("a*[b]\\c"), "a\\*\\[b\\]\\\\c");
  EXPECT_EQ(glob_literal(""), "");
}

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.ok()) << "redis-server did not start (scripts/setup installs it)"; }
  testing::RedisServer server_;
  asio::io_context ioc_;
};

TEST_F(RedisClientTest, Commands) {
  Client c(ioc_, options(server_));
  c.start();
  run(ioc_, [&]() -> Task<void> {
    auto set = co_await c.exec(Command{"SET", "k", "v"});
    EXPECT_TRUE(set && set->type == Reply::Type::status && set->str == "OK");
    auto get = co_await c.exec(Command{"GET", "k"});
    EXPECT_TRUE(get && get->str == "v");
    auto missing = co_await c.exec(Command{"GET", "nope"});
    EXPECT_TRUE(missing && missing->is_nil());
    auto incr = co_await c.exec(Command{"INCRBY", "n", "5"});
    EXPECT_TRUE(incr && incr->integer == 5);
    co_await c.exec(Command{"RPUSH", "l", "a", "b", "c"});
    auto range = co_await c.exec(Command{"LRANGE", "l", "0", "-1"});
    EXPECT_TRUE(range && range->elements.size() == 3 && range->elements[2].str == "c");
    auto wrong = co_await c.exec(Command{"INCR", "l"});
    EXPECT_FALSE(wrong);
    if (!wrong) {
      EXPECT_EQ(wrong.error().code, Errc::server);
      EXPECT_TRUE(wrong.error().message.starts_with("WRONGTYPE"));
    }
    // An error reply does not disturb the commands behind it.
    auto after = co_await c.exec(Command{"GET", "k"});
    EXPECT_TRUE(after && after->str == "v");
  });
  EXPECT_TRUE(c.connected());
  EXPECT_EQ(c.stats().connects, 1u);
  c.stop();
}

TEST_F(RedisClientTest, PipelinesABatchAndConcurrentCallers) {
  Client c(ioc_, options(server_));
  c.start();
  run(ioc_, [&]() -> Task<void> {
    std::vector<Command> batch;
    for (int i = 0; i < 1000; ++i) batch.push_back(Command{"INCR", "ctr"});
    auto rs = co_await c.exec(std::move(batch));
    EXPECT_EQ(rs.size(), 1000u);
    for (std::size_t i = 0; i < rs.size(); ++i) {
      EXPECT_TRUE(rs[i] && rs[i]->integer == static_cast<std::int64_t>(i + 1)) << i;
      if (!rs[i] || rs[i]->integer != static_cast<std::int64_t>(i + 1)) break;
    }
  });
  // 50 coroutines at once on one connection: each gets its own reply.
  int done = 0;
  for (int i = 0; i < 50; ++i) {
    asio::co_spawn(
        ioc_,
        [&c, &done, i]() -> Task<void> {
          const std::string key = "key" + std::to_string(i);
          co_await c.exec(Command{"SET", key, std::to_string(i * 7)});
          auto r = co_await c.exec(Command{"GET", key});
          EXPECT_TRUE(r && r->str == std::to_string(i * 7));
          ++done;
        },
        asio::detached);
  }
  const auto deadline = Clock::now() + 10s;
  while (done < 50 && Clock::now() < deadline) ioc_.run_one_for(50ms);
  EXPECT_EQ(done, 50);
  EXPECT_EQ(c.stats().connects, 1u);
  c.stop();
}

TEST_F(RedisClientTest, TimesOutOnAServerThatStopsAnswering) {
  auto o = options(server_);
  o.command_timeout = 100ms;
  Client c(ioc_, o);
  c.start();
  run(ioc_, [&]() -> Task<void> {
    EXPECT_TRUE(co_await until_up(c));
    server_.pause();
    const auto t0 = Clock::now();
    auto r = co_await c.exec(Command{"PING"});
    const auto took = Clock::now() - t0;
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code, Errc::timeout);
    }
    EXPECT_GE(took, 90ms);
    EXPECT_LT(took, 2000ms);
    // The connection was dropped: callers learn it at once until it is back.
    auto fast = co_await c.exec(Command{"PING"});
    EXPECT_FALSE(fast);
    server_.resume();
    EXPECT_TRUE(co_await until_up(c));
  });
  EXPECT_GE(c.stats().timeouts, 1u);
  EXPECT_GE(c.stats().connects, 2u);
  c.stop();
}

TEST_F(RedisClientTest, ReconnectsAfterRestartAndReloadsScripts) {
  Client c(ioc_, options(server_));
  c.start();
  Script script("return tonumber(ARGV[1]) * 2");
  run(ioc_, [&]() -> Task<void> {
    EXPECT_TRUE(co_await until_up(c));
    const std::string none[] = {"21"};
    auto r = co_await c.exec(Command::evalsha(script, {}, none));
    EXPECT_TRUE(r && r->integer == 42);
    EXPECT_EQ(c.stats().script_loads, 1u);  // NOSCRIPT on first use, then SCRIPT LOAD
    auto again = co_await c.exec(Command::evalsha(script, {}, none));
    EXPECT_TRUE(again && again->integer == 42);
    EXPECT_EQ(c.stats().script_loads, 1u);

    server_.kill();
    auto down = co_await c.exec(Command{"PING"});
    EXPECT_FALSE(down);
    if (!down) {
      EXPECT_TRUE(down.error().code == Errc::connection_lost || down.error().code == Errc::not_connected)
          << to_string(down.error().code);
    }
    EXPECT_FALSE(c.connected());
    EXPECT_TRUE(server_.start());
    EXPECT_TRUE(co_await until_up(c));
    EXPECT_TRUE(c.connected());
    // A fresh server has no scripts: NOSCRIPT, SCRIPT LOAD, retry.
    auto reloaded = co_await c.exec(Command::evalsha(script, {}, none));
    EXPECT_TRUE(reloaded && reloaded->integer == 42);
    EXPECT_EQ(c.stats().script_loads, 2u);
    // SCRIPT FLUSH inside a pipeline: every EVALSHA of the batch is retried.
    co_await c.exec(Command{"SCRIPT", "FLUSH"});
    std::vector<Command> batch;
    for (int i = 0; i < 3; ++i) batch.push_back(Command::evalsha(script, {}, none));
    batch.push_back(Command{"PING"});
    auto rs = co_await c.exec(std::move(batch));
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(rs[i] && rs[i]->integer == 42) << i;
    EXPECT_TRUE(rs[3] && rs[3]->str == "PONG");
    EXPECT_EQ(c.stats().script_loads, 3u);
  });
  EXPECT_GE(c.stats().disconnects, 1u);
  c.stop();
}

TEST_F(RedisClientTest, FailsFastWhenNothingListens) {
  testing::RedisServer gone;
  ASSERT_TRUE(gone.ok());
  auto o = options(gone);
  gone.kill();
  o.command_timeout = 5000ms;
  Client c(ioc_, o);
  c.start();
  run(ioc_, [&]() -> Task<void> {
    // The first attempt is refused at once; later commands fail without waiting for the timeout.
    co_await c.exec(Command{"PING"});
    const auto t0 = Clock::now();
    auto r = co_await c.exec(Command{"PING"});
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code, Errc::not_connected);
      // Why, not only that: the caller's outage line says it.
      EXPECT_EQ(r.error().message, "cannot connect to Redis: Connection refused");
    }
    EXPECT_LT(Clock::now() - t0, 1000ms);
  });
  EXPECT_GE(c.stats().connect_failures, 1u);
  c.stop();
  run(ioc_, [&]() -> Task<void> {
    auto r = co_await c.exec(Command{"PING"});
    EXPECT_FALSE(r);
    if (!r) {
      EXPECT_EQ(r.error().code, Errc::stopped);
    }
  });
}

// A connection idle for idle_check gets a PING before the next commands. Redis stopped (as a
// connection a middlebox dropped: no reply, no FIN), the PING goes unanswered: the command waiting
// behind it is written on a new connection instead, made at once, never on the silent one, and its
// caller waits for it (connect_timeout + command_timeout more, once).
TEST_F(RedisClientTest, AnIdleCheckThatGoesUnansweredCarriesTheCommandsToANewConnection) {
  auto o = options(server_);
  o.command_timeout = 200ms;
  o.connect_timeout = 2000ms;
  o.idle_check = 100ms;
  std::vector<std::string> logs;
  o.log = [&logs](std::string_view m) { logs.emplace_back(m); };
  Client c(ioc_, o);
  c.start();
  run(ioc_, [&]() -> Task<void> {
    EXPECT_TRUE(co_await until_up(c));
    co_await sleep_for(150ms);
    auto checked = co_await c.exec(Command{"SET", "k", "1"});  // after 150 ms idle: PING first, answered
    EXPECT_TRUE(checked);
    EXPECT_EQ(c.stats().idle_checks, 1u);
    co_await sleep_for(150ms);
    server_.pause();
    auto resume = [&]() -> Task<void> {
      co_await sleep_for(400ms);  // after the PING's command_timeout
      server_.resume();
    };
    asio::co_spawn(ioc_, resume(), asio::detached);
    auto r = co_await c.exec(Command{"INCR", "k"});
    EXPECT_TRUE(r) << r.error().message;
    if (r) {
      EXPECT_EQ(r->as_int(), 2) << "run once";
    }
  });
  EXPECT_EQ(c.stats().idle_check_failures, 1u);
  EXPECT_EQ(c.stats().timeouts, 0u);
  EXPECT_EQ(c.stats().connects, 2u);
  EXPECT_EQ(std::count_if(logs.begin(), logs.end(),
                          [](const std::string& l) { return l.find("lost: no reply to a PING") != l.npos; }),
            1)
      << ::testing::PrintToString(logs);
  c.stop();
}

// Redis's `timeout` closes idle connections: the client reconnects at once
// (no backoff: commands issued meanwhile queue) and says so once.
TEST_F(RedisClientTest, ReconnectsAtOnceAfterAnIdleCloseAndSaysSoOnce) {
  auto o = options(server_);
  o.reconnect_min = 60s;  // a backoff would fail the commands below at once
  o.reconnect_max = 60s;
  std::vector<std::string> logs;
  o.log = [&logs](std::string_view m) { logs.emplace_back(m); };
  Client c(ioc_, o);
  c.start();
  run(ioc_, [&]() -> Task<void> {
    EXPECT_TRUE(co_await until_up(c));
    EXPECT_TRUE(co_await c.exec(Command{"CONFIG", "SET", "timeout", "1"}));
    const auto deadline = Clock::now() + 20s;
    while (c.stats().idle_closes < 2 && Clock::now() < deadline) co_await sleep_for(20ms);
    EXPECT_GE(c.stats().idle_closes, 2u);
    auto r = co_await c.exec(Command{"PING"});
    EXPECT_TRUE(r) << r.error().message;
    EXPECT_TRUE(co_await c.exec(Command{"CONFIG", "SET", "timeout", "0"}));
  });
  const auto said = [&](std::string_view text) {
    return std::count_if(logs.begin(), logs.end(), [&](const std::string& l) { return l.find(text) != l.npos; });
  };
  EXPECT_EQ(said("closed by server while idle"), 1) << ::testing::PrintToString(logs);
  EXPECT_EQ(said("connected to"), 1) << ::testing::PrintToString(logs);
  EXPECT_EQ(said(" lost: "), 0) << ::testing::PrintToString(logs);
  c.stop();
}

TEST(RedisClientAuthTest, AuthenticatesAndSelectsTheDatabase) {
  testing::RedisServer server({"--requirepass", "s3cret-pass"});
  ASSERT_TRUE(server.ok());
  asio::io_context ioc;
  auto o = options(server);
  o.password = "s3cret-pass";
  o.db = 3;
  Client good(ioc, o);
  good.start();
  o.password = "wrong";
  o.db = 0;
  std::vector<std::string> logs;
  o.log = [&logs](std::string_view m) { logs.emplace_back(m); };
  Client bad(ioc, o);
  bad.start();
  o.password = "s3cret-pass";
  o.log = nullptr;
  Client db0(ioc, o);
  db0.start();
  run(ioc, [&]() -> Task<void> {
    EXPECT_TRUE(co_await until_up(good));
    co_await good.exec(Command{"SET", "where", "db3"});
    EXPECT_TRUE(co_await until_up(db0));
    auto in0 = co_await db0.exec(Command{"GET", "where"});
    EXPECT_TRUE(in0 && in0->is_nil());
    auto in3 = co_await good.exec(Command{"GET", "where"});
    EXPECT_TRUE(in3 && in3->str == "db3");
    auto r = co_await bad.exec(Command{"PING"});
    EXPECT_FALSE(r);
  });
  EXPECT_FALSE(bad.connected());
  ASSERT_FALSE(logs.empty());
  EXPECT_NE(logs[0].find("AUTH"), std::string::npos) << logs[0];
  EXPECT_EQ(logs[0].find("wrong"), std::string::npos) << "the password must not be logged";
  good.stop();
  bad.stop();
  db0.stop();
}

TEST(RedisClientAuthTest, SaysWhyReconnectingFailsAfterALostConnection) {
  // The password changed under a live connection, which is then killed:
  // the reconnects fail with WRONGPASS, logged once after "lost" (it went
  // unsaid while the outage was already reported), and the commands refused
  // meanwhile carry it.
  testing::RedisServer server({"--requirepass", "first-pass"});
  ASSERT_TRUE(server.ok());
  asio::io_context ioc;
  auto o = options(server);
  o.password = "first-pass";
  std::vector<std::string> logs;
  o.log = [&logs](std::string_view m) { logs.emplace_back(m); };
  Client c(ioc, o);
  c.start();
  std::string why;
  run(ioc, [&]() -> Task<void> {
    EXPECT_TRUE(co_await until_up(c));
    EXPECT_TRUE(co_await c.exec(Command{"CONFIG", "SET", "requirepass", "second-pass"}));
    co_await c.exec(Command{"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no"});  // this connection
    const auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      auto r = co_await c.exec(Command{"PING"});
      if (!r && r.error().message.find("WRONGPASS") != std::string::npos) {
        why = r.error().message;
        break;
      }
      co_await sleep_for(10ms);
    }
    co_await sleep_for(300ms);  // more failed attempts (10-100 ms apart): the same reason is not logged again
  });
  EXPECT_EQ(why.rfind("cannot connect to Redis: AUTH/SELECT failed: WRONGPASS", 0), 0u) << why;
  const auto said = [&](std::string_view text) {
    return std::count_if(logs.begin(), logs.end(), [&](const std::string& l) { return l.find(text) != l.npos; });
  };
  EXPECT_EQ(said(" lost: "), 1) << ::testing::PrintToString(logs);
  EXPECT_EQ(said("cannot connect to 127.0.0.1:" + std::to_string(server.port()) + ": AUTH/SELECT failed: WRONGPASS"), 1)
      << ::testing::PrintToString(logs);
  EXPECT_GE(c.stats().connect_failures, 3u);
  c.stop();
}

// A client waiting out a long reconnect backoff (Redis was down) connects
// at once when asked (a shutdown's final push): it does not fail the
// command at once as it does while waiting.
TEST_F(RedisClientTest, ReconnectNowCutsTheBackoffShort) {
  server_.kill();
  auto o = options(server_);
  o.reconnect_min = 60s;
  o.reconnect_max = 60s;
  Client c(ioc_, o);
  c.start();
  run(ioc_, [&]() -> Task<void> {
    // The first attempt is refused; the client then waits 60 s.
    auto down = co_await c.exec(Command{"PING"});
    EXPECT_FALSE(down);
    EXPECT_TRUE(server_.start());
    auto waiting = co_await c.exec(Command{"PING"});
    EXPECT_FALSE(waiting) << "still in its backoff: fails at once";
    if (!waiting) {
      EXPECT_EQ(waiting.error().code, Errc::not_connected);
    }
    const auto t0 = Clock::now();
    EXPECT_TRUE(co_await c.reconnect_now());
    EXPECT_LT(Clock::now() - t0, 30s) << "not the 60 s backoff";
    auto up = co_await c.exec(Command{"PING"});
    EXPECT_TRUE(up && up->str == "PONG");
    EXPECT_TRUE(co_await c.reconnect_now()) << "connected: true at once";
  });
  // Nothing listening: the attempt fails, and says so.
  server_.kill();
  run(ioc_, [&]() -> Task<void> {
    EXPECT_FALSE(co_await c.exec(Command{"PING"}));  // the connection is lost; a 60 s wait begins
    EXPECT_FALSE(co_await c.reconnect_now());
  });
  c.stop();
  run(ioc_, [&]() -> Task<void> { EXPECT_FALSE(co_await c.reconnect_now()) << "stopped"; });
}

}  // namespace
}  // namespace weir::store
