// The worker against a real loopback HTTP/1.1 server in the test process.
// Assertions are on counts, never on how fast anything ran.
#include "bench/lib/worker.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "bench/lib/payload.hpp"

namespace weir::bench {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct ServerOptions {
  bool sse = true;
  int tokens = 5;
  bool send_done = true;              // end the stream with data: [DONE]
  bool close_after_response = false;  // close without announcing it (stale keep-alive)
  int delay_ms = 0;                   // before each response
  int event_gap_ms = 0;               // SSE: write each event on its own, this far apart
};

// A blocking, thread-per-connection HTTP/1.1 server on 127.0.0.1:0.
class TestServer {
 public:
  explicit TestServer(ServerOptions o) : opt_(o), acceptor_(ioc_, tcp::endpoint(asio::ip::address_v4::loopback(), 0)) {
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~TestServer() {
    // Neither close() nor (reliably, e.g. under ASan) shutdown() wakes a
    // thread blocked in accept(): a connection of our own does.
    stopping_ = true;
    {
      boost::system::error_code ec;
      tcp::socket wake(ioc_);
      wake.connect(acceptor_.local_endpoint(), ec);
    }
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
    accept_thread_.join();
    boost::system::error_code ec;
    acceptor_.close(ec);
    std::lock_guard lock(mu_);
    for (auto& t : conn_threads_) t.join();
  }
  tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }
  int connections() const { return connections_.load(); }

 private:
  void accept_loop() {
    for (;;) {
      auto sock = std::make_shared<tcp::socket>(ioc_);
      boost::system::error_code ec;
      acceptor_.accept(*sock, ec);
      if (ec || stopping_) return;
      ++connections_;
      std::lock_guard lock(mu_);
      conn_threads_.emplace_back([this, sock] { serve(*sock); });
    }
  }

  void serve(tcp::socket& s) {
    std::string in;
    char buf[4096];
    for (;;) {
      // One request: headers, then Content-Length bytes of body.
      std::size_t hdr_end;
      while ((hdr_end = in.find("\r\n\r\n")) == std::string::npos) {
        boost::system::error_code ec;
        const std::size_t n = s.read_some(asio::buffer(buf), ec);
        if (ec) return;
        in.append(buf, n);
      }
      std::size_t len = 0;
      if (auto p = in.find("Content-Length: "); p != std::string::npos && p < hdr_end) {
        len = std::stoul(in.substr(p + 16));
      }
      while (in.size() < hdr_end + 4 + len) {
        boost::system::error_code ec;
        const std::size_t n = s.read_some(asio::buffer(buf), ec);
        if (ec) return;
        in.append(buf, n);
      }
      in.erase(0, hdr_end + 4 + len);
      if (opt_.delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(opt_.delay_ms));
      boost::system::error_code ec;
      if (opt_.sse && opt_.event_gap_ms) {
        // Event by event (each a chunk), as a model server streams: a client may leave between them.
        const std::string all = response();
        std::size_t at = all.find("\r\n\r\n") + 4;
        asio::write(s, asio::buffer(all.data(), at), ec);
        while (!ec && at < all.size()) {
          const std::size_t end = all.find("\n\n\r\n", at);  // an event's blank line, then its chunk's CRLF
          const std::size_t next = end == std::string::npos ? all.size() : end + 4;
          std::this_thread::sleep_for(std::chrono::milliseconds(opt_.event_gap_ms));
          asio::write(s, asio::buffer(all.data() + at, next - at), ec);
          at = next;
        }
        if (ec) return;
        continue;
      }
      asio::write(s, asio::buffer(response()), ec);
      if (ec || opt_.close_after_response || (opt_.sse && !opt_.send_done)) {
        s.close(ec);
        return;
      }
    }
  }

  std::string response() const {
    if (!opt_.sse) {
      const std::string body =
          R"({"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}})";
      return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n\r\n" + body;
    }
    std::string out = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    auto chunk = [&out](const std::string& ev) {
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", ev.size());
      out += size;
      out += ev;
      out += "\r\n";
    };
    chunk("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
    for (int i = 0; i < opt_.tokens; ++i) {
      chunk("data: {\"choices\":[{\"delta\":{\"content\":\"t" + std::to_string(i) + "\"}}]}\n\n");
    }
    if (opt_.send_done) {
      chunk("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":" +
            std::to_string(opt_.tokens) + "}}\n\ndata: [DONE]\n\n");
      out += "0\r\n\r\n";
    }
    return out;
  }

  ServerOptions opt_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> conn_threads_;
  std::atomic<int> connections_{0};
  std::atomic<bool> stopping_{false};
};

Plan make_plan(const tcp::endpoint& ep, bool sse) {
  Plan p;
  p.endpoint = ep;
  const std::string body = sse ? R"({"model":"m","stream":true})" : R"({"model":"m"})";
  p.requests.push_back(build_request("/v1/chat/completions", "127.0.0.1", {}, body, sse));
  p.threads = 1;
  p.connections = 1000;
  p.timeout_ns = 20'000'000'000;  // generous: the assertions are about counts
  p.stall_ns = 0;
  p.start_ns = now_ns() + 1'000'000;
  p.measure_start_ns = p.start_ns;
  p.end_ns = p.start_ns + 200'000'000;
  return p;
}

std::uint64_t outcome(const Stats& s, Outcome o) { return s.outcomes[static_cast<std::size_t>(o)]; }

TEST(BenchWorker, OpenLoopStreamsAreCountedTokenByToken) {
  TestServer server({});
  Plan p = make_plan(server.endpoint(), true);
  p.rate = 250;  // 50 requests in 200 ms
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_EQ(s.scheduled, 50u);
  EXPECT_EQ(s.sent, 50u);
  EXPECT_EQ(s.completed, 50u);
  EXPECT_EQ(outcome(s, Outcome::ok), 50u);
  EXPECT_EQ(s.errors(), 0u);
  EXPECT_EQ(s.tokens, 50u * 5);
  EXPECT_EQ(s.events, 50u * 8);  // role delta, 5 tokens, usage, [DONE]
  EXPECT_EQ(s.events_total, s.events);
  EXPECT_EQ(s.usage_completion_tokens, 50u * 5);
  EXPECT_EQ(s.usage_prompt_tokens, 50u * 7);
  EXPECT_EQ(s.ttft.count(), 50u);
  EXPECT_EQ(s.itl.count(), 50u * 4);
  EXPECT_EQ(s.e2e.count(), 50u);
  EXPECT_EQ(s.sender_lag.count(), 50u);
  EXPECT_GE(s.connections_opened, 1u);
}

TEST(BenchWorker, ClosedLoopKeepsConcurrency) {
  TestServer server({.sse = false});
  Plan p = make_plan(server.endpoint(), false);
  p.open_loop = false;
  p.concurrency = 4;
  p.connections = 4;
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_GT(s.completed, 4u);
  EXPECT_EQ(outcome(s, Outcome::ok), s.completed);
  EXPECT_EQ(s.tokens, 2 * s.completed);  // non-streamed: usage.completion_tokens
  EXPECT_LE(s.connections_opened, 4u);
  EXPECT_EQ(s.max_busy, 4u);
  EXPECT_EQ(s.sender_lag.count(), 0u);
}

TEST(BenchWorker, StaleKeepAliveConnectionIsRetriedOnce) {
  TestServer server({.sse = false, .close_after_response = true});
  Plan p = make_plan(server.endpoint(), false);
  p.rate = 100;  // 20 requests, 10 ms apart: each finds its idle connection closed
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_EQ(s.completed, 20u);
  EXPECT_EQ(outcome(s, Outcome::ok), 20u);
  EXPECT_GT(s.reconnects, 0u);
  EXPECT_EQ(s.sent, 20u);  // a retry is not a second send of the same request
}

TEST(BenchWorker, StreamsWithoutDoneAreTruncated) {
  TestServer server({.send_done = false});
  Plan p = make_plan(server.endpoint(), true);
  p.rate = 100;
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_EQ(s.completed, 20u);
  EXPECT_EQ(outcome(s, Outcome::truncated), 20u);
  EXPECT_EQ(s.ttft.count(), 20u);  // the tokens that did arrive are measured
  EXPECT_EQ(s.e2e.count(), 0u);
}

TEST(BenchWorker, LeavingClientsCloseMidStreamAndAreNotErrors) {
  TestServer server({.tokens = 20, .event_gap_ms = 2});
  Plan p = make_plan(server.endpoint(), true);
  p.rate = 100;  // 20 requests
  p.leave_fraction = 1.0;
  p.leave_after = 3;
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_EQ(s.completed, 20u);
  EXPECT_EQ(outcome(s, Outcome::left), 20u);
  EXPECT_EQ(s.errors(), 0u);
  EXPECT_EQ(s.ttft.count(), 20u);
  EXPECT_LT(s.events, 20u * 23);  // none read its whole stream (23 events)
  EXPECT_GE(s.events, 20u * 3);
}

TEST(BenchWorker, AFractionLeavesTheOthersReadToTheEnd) {
  TestServer server({.tokens = 10, .event_gap_ms = 5});
  Plan p = make_plan(server.endpoint(), true);
  p.rate = 200;  // 40 requests; seed 1 draws 17 of them to leave
  p.leave_fraction = 0.5;
  p.leave_after = 2;
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_EQ(s.completed, 40u);
  // A drawn client whose whole stream came in one read has nothing left to leave: at most 17.
  EXPECT_GE(outcome(s, Outcome::left), 10u);
  EXPECT_LE(outcome(s, Outcome::left), 17u);
  EXPECT_GE(outcome(s, Outcome::ok), 23u);
  EXPECT_EQ(outcome(s, Outcome::left) + outcome(s, Outcome::ok), 40u);
}

TEST(BenchWorker, RefusedConnectionsAreConnectErrors) {
  tcp::endpoint dead;
  {
    TestServer server({});
    dead = server.endpoint();
  }  // closed: nothing listens there now
  Plan p = make_plan(dead, true);
  p.rate = 100;
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_EQ(s.completed, 20u);
  EXPECT_EQ(outcome(s, Outcome::connect), 20u);
  EXPECT_EQ(s.sent, 0u);
  EXPECT_EQ(s.connect_generator, 0u);  // the target's refusal, not the generator's limit
}

TEST(BenchWorker, ConnectionCapQueuesAndIsReportedAsTheGenerators) {
  TestServer server({.sse = false, .delay_ms = 20});
  Plan p = make_plan(server.endpoint(), false);
  p.rate = 100;
  p.connections = 1;  // 20 requests through one connection of a 20 ms server
  Worker w(p, 0);
  w.run();
  const Stats& s = w.stats();
  EXPECT_EQ(outcome(s, Outcome::ok), 20u);
  EXPECT_EQ(s.connections_opened, 1u);
  EXPECT_GT(s.pool_cap_waits, 0u);
  RunInfo run;
  run.rate = 100;
  run.duration_s = 0.2;
  run.max_lag_ns = 1'000'000'000;
  EXPECT_TRUE(assess(run, s).generator_saturated);
}

}  // namespace
}  // namespace weir::bench
