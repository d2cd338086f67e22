// The respond phase of a proxied request against a scripted upstream
// exchange (no model server): which failures are retried and where, that
// nothing is retried once the response is committed, and that a client that
// leaves cancels the upstream request. The client is a real TCP connection
// to the Downstream; the gateway runs on a Worker that is not started (its
// io_context runs here).
#include <deque>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "http/downstream.hpp"

namespace weir::gateway {
namespace {

namespace asio = boost::asio;
namespace bh = boost::beast::http;
using http::UpstreamFailure;

// One scripted attempt.
struct Attempt {
  UpstreamFailure connect = UpstreamFailure::none;  // a fresh connect's result
  UpstreamFailure start = UpstreamFailure::none;
  std::size_t upstream_bytes = 0;  // answered before failing
  int status = 200;
  std::string content_type = "application/json";
  std::deque<std::string> body;                          // one read each
  UpstreamFailure body_failure = UpstreamFailure::none;  // after the body pieces
  bool hang = false;                                     // after the pieces: wait until cancelled
};

class ScriptedExchange final : public http::UpstreamExchange {
 public:
  explicit ScriptedExchange(core::Executor ex) : cancelled_event_(ex) {}
  std::deque<Attempt> script;
  int connects = 0, starts = 0, uses = 0, cancels = 0, releases = 0;

  void use(std::unique_ptr<http::UpstreamConnection>) override { ++uses; }
  core::Task<UpstreamFailure> connect(const http::tcp::endpoint&, std::chrono::milliseconds) override {
    ++connects;
    co_return script.front().connect == UpstreamFailure::none ? UpstreamFailure::none : pop().connect;
  }
  core::Task<UpstreamFailure> start(const Request& r) override {
    ++starts;
    last_head = std::string(r.head);
    cur_ = pop();
    if (cur_.start != UpstreamFailure::none) co_return cur_.start;
    head_ = {};
    head_.result(cur_.status);
    head_.set(bh::field::content_type, cur_.content_type);
    done_ = cur_.body.empty() && cur_.body_failure == UpstreamFailure::none && !cur_.hang;
    co_return UpstreamFailure::none;
  }
  std::size_t upstream_bytes() const override { return cur_.upstream_bytes; }
  std::unique_ptr<http::UpstreamConnection> release() override {
    ++releases;
    return nullptr;
  }
  const http::ResponseHead& head() const override { return head_; }
  bool done() const override { return done_; }
  core::Task<http::BodyRead> read(std::span<char> into) override {
    http::BodyRead r;
    if (!cur_.body.empty()) {
      const std::string piece = std::move(cur_.body.front());
      cur_.body.pop_front();
      std::copy(piece.begin(), piece.end(), into.begin());
      r.bytes = piece.size();
      if (cur_.body.empty() && cur_.body_failure == UpstreamFailure::none && !cur_.hang) done_ = r.end = true;
      co_return r;
    }
    if (cur_.hang) {
      while (!cancelled_) co_await cancelled_event_.wait();
      r.failure = UpstreamFailure::cancelled;
      co_return r;
    }
    r.failure = cur_.body_failure;
    co_return r;
  }
  void cancel() override {
    ++cancels;
    cancelled_ = true;
    cancelled_event_.notify();
  }
  std::string last_head;

 private:
  Attempt pop() {
    Attempt a = std::move(script.front());
    script.pop_front();
    return a;
  }
  Attempt cur_;
  http::ResponseHead head_;
  bool done_ = false;
  bool cancelled_ = false;
  core::Event cancelled_event_;
};

// A worker (not started) over a pool of two endpoints nobody listens on.
struct Gateway {
  Shared shared;
  std::unique_ptr<Worker> worker;

  Gateway() {
    auto cfg = core::parse_config(
        "pools: {p: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2]}}\ndefault_pool: p\n"
        "server: {access_log: 'off'}\n",
        "t");
    EXPECT_TRUE(cfg) << cfg.error().to_string();
    shared.config = std::make_shared<core::Config>(std::move(*cfg));
    shared.routes = std::make_unique<routing::RouteTable>(*shared.config);
    std::string err;
    shared.log_sink = core::AccessLogSink::open("off", err);
    shared.endpoint_addrs = {{http::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 1),
                              http::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 2)}};
    worker = std::make_unique<Worker>(shared, 0);
  }
};

// What the client saw, and what the gateway did.
struct Served {
  std::string response;  // every byte the client received
  RequestContext ctx;
};

// Sends `request` from a real client socket, serves it through the phases
// with `ex` as the upstream, and reads what comes back (until close, or
// `close_after` bytes, when the client then leaves).
void serve(Gateway& g, ScriptedExchange& ex, const std::string& request, Served& out, std::size_t close_after = 0) {
  auto& io = g.worker->io();
  http::Acceptor acc(io.get_executor(), http::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  asio::io_context client_io;
  asio::ip::tcp::socket client(client_io);
  client.connect(acc.local_endpoint());
  http::Socket server = acc.accept();
  asio::write(client, asio::buffer(request));
  http::Downstream down(std::move(server), g.shared.config->server, nullptr);
  GatewayPhases phases(*g.worker, down, ex);
  struct Gone final : http::Downstream::Listener {
    GatewayPhases& p;
    RequestContext& ctx;
    Gone(GatewayPhases& p, RequestContext& c) : p(p), ctx(c) {}
    void on_client_gone() override { p.on_client_gone(ctx); }
  } gone(phases, out.ctx);
  down.set_listener(&gone);
  bool finished = false;
  bool deadline_hit = false;
  asio::co_spawn(
      io.get_executor(),
      [&]() -> core::Task<void> {
        const auto h = co_await down.read_head(true, false);
        EXPECT_EQ(h, http::Downstream::Head::request);
        out.ctx.t_start = core::now();
        down.begin_request();
        co_await run_pipeline(phases, out.ctx);
        co_await down.shutdown();
        finished = true;
      },
      asio::detached);
  client.non_blocking(true);
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!finished) {
    if (!deadline_hit && std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the request did not finish within 10 s";
      down.force_close();
      ex.cancel();
      deadline_hit = true;
    }
    io.run_for(std::chrono::milliseconds(5));
    boost::system::error_code ec;
    for (;;) {
      const std::size_t n = client.read_some(asio::buffer(buf), ec);
      if (ec) break;
      out.response.append(buf, n);
    }
    if (close_after && out.response.size() >= close_after && client.is_open()) client.close();
  }
}

std::string chat(bool stream) {
  const std::string body = std::string(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":)") +
                           (stream ? "true" : "false") + "}";
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

TEST(ProxyPhase, ARefusedEndpointIsRetriedOnTheOther) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.connect = UpstreamFailure::connect_refused},
               Attempt{.body = {R"({"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}})"}}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.connects, 2);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(r.ctx.retries, 1u);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_TRUE(r.ctx.has_usage);
  EXPECT_EQ(r.response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r.response;
  EXPECT_NE(r.response.find("x-request-id: "), std::string::npos);
}

TEST(ProxyPhase, EveryEndpointRefusingIsOne502NamingThePool) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.connect = UpstreamFailure::connect_refused},
               Attempt{.connect = UpstreamFailure::connect_refused}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.connects, 2);
  EXPECT_EQ(ex.starts, 0);
  EXPECT_EQ(r.ctx.status, 502);
  EXPECT_EQ(r.ctx.error_code, "upstream_unavailable");
  EXPECT_NE(r.response.find("pool `p`"), std::string::npos) << r.response;
  EXPECT_EQ(r.response.find("127.0.0.1"), std::string::npos) << r.response;
}

TEST(ProxyPhase, AFailureAfterTheUpstreamAnsweredIsNeverSentTwice) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.start = UpstreamFailure::reset, .upstream_bytes = 17}, Attempt{}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(r.ctx.status, 502);
  EXPECT_EQ(ex.script.size(), 1u) << "the second attempt was not used";
}

TEST(ProxyPhase, AStaleFreshConnectionFailureIsNotRetriedEither) {
  // Only a *reused* pooled connection that fails at once is sent again;
  // a fresh one that resets may be an upstream that started the request.
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.start = UpstreamFailure::reset}, Attempt{}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(r.ctx.status, 502);
}

TEST(ProxyPhase, NothingIsRetriedAfterTheCommitPointAndTheStreamEndsInBand) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream",
                       .body = {"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"},
                       .body_failure = UpstreamFailure::reset},
               Attempt{}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(ex.script.size(), 1u);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_TRUE(r.ctx.committed);
  EXPECT_EQ(r.ctx.error_code, "upstream_unavailable");
  EXPECT_EQ(r.response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r.response;
  const auto token = r.response.find("\"Hi\"");
  const auto error = r.response.find("data: {\"error\"");
  const auto done = r.response.find("data: [DONE]");
  ASSERT_NE(token, std::string::npos) << r.response;
  ASSERT_NE(error, std::string::npos) << r.response;
  ASSERT_NE(done, std::string::npos) << r.response;
  EXPECT_LT(token, error);
  EXPECT_LT(error, done);
  EXPECT_NE(r.response.find("0\r\n\r\n"), std::string::npos) << "the chunked body ends";
  EXPECT_EQ(r.ctx.events, 1u);
}

TEST(ProxyPhase, AClientThatLeavesMidStreamCancelsTheUpstream) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream",
                       .body = {"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"},
                       .hang = true}};
  Served r;
  serve(g, ex, chat(true), r, /*close_after=*/60);
  EXPECT_GE(ex.cancels, 1);  // at once by the listener (and again, harmlessly, when the relay ends)
  EXPECT_EQ(r.ctx.status, 499);
  EXPECT_EQ(r.ctx.error_code, "client_closed_request");
}

TEST(ProxyPhase, TheClientsCredentialAndRequestIdAreReplacedUpstream) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.body = {"{}"}}};
  std::string req = chat(false);
  req.insert(req.find("\r\n") + 2, "x-request-id: abc-123\r\n");
  Served r;
  serve(g, ex, req, r);
  EXPECT_NE(ex.last_head.find("x-request-id: abc-123\r\n"), std::string::npos) << ex.last_head;
  EXPECT_NE(ex.last_head.find("Content-Length: "), std::string::npos);
  EXPECT_EQ(ex.last_head.find("Connection:"), std::string::npos) << "hop-by-hop fields stay here";
  EXPECT_EQ(r.ctx.request_id, "abc-123");
}

}  // namespace
}  // namespace weir::gateway
