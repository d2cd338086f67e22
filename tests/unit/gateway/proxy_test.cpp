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
#include <boost/json.hpp>

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
  std::string retry_after;                               // a Retry-After field, if not empty
};

class ScriptedExchange final : public http::UpstreamExchange {
 public:
  explicit ScriptedExchange(core::Executor ex) : cancelled_event_(ex) {}
  std::deque<Attempt> script;
  int connects = 0, starts = 0, uses = 0, cancels = 0, releases = 0;

  void use(std::unique_ptr<http::UpstreamConnection>) override { ++uses; }
  core::Task<UpstreamFailure> connect(const http::tcp::endpoint&, const http::TlsTarget&, std::chrono::milliseconds,
                                      std::chrono::steady_clock::time_point) override {
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
    if (!cur_.retry_after.empty()) head_.set(bh::field::retry_after, cur_.retry_after);
    bodies.push_back(std::string(r.body));
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
  std::vector<std::string> bodies;  // the request body of every start()

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

// A worker (not started) over a pool of two endpoints nobody listens on,
// or over the pools of `yaml` (endpoints nobody listens on either).
struct Gateway {
  Shared shared;
  std::unique_ptr<Worker> worker;

  explicit Gateway(const std::string& yaml =
                       "pools: {p: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2]}}\n"
                       "default_pool: p\n") {
    auto cfg = core::parse_config(yaml + "server: {access_log: 'off'}\n", "t");
    EXPECT_TRUE(cfg) << cfg.error().to_string();
    GenerationInput in;
    in.config = std::make_shared<core::Config>(std::move(*cfg));
    std::string err;
    shared.log_sink = core::AccessLogSink::open("off", err);
    for (const auto& pool : in.config->pools) {
      std::vector<http::tcp::endpoint> addrs;
      for (const auto& ep : pool.endpoints) addrs.emplace_back(asio::ip::make_address("127.0.0.1"), ep.port);
      in.addrs.push_back(std::move(addrs));
    }
    auto gen = build_generation(std::move(in), nullptr);
    EXPECT_TRUE(gen) << gen.error();
    shared.generation = *gen;
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
  http::Downstream down(std::move(server), g.shared.generation->config->server, nullptr);
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
  EXPECT_EQ(r.ctx.events, 3u) << "the token, Weir's error event and [DONE]: every data event the client got";
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
  // The client's id goes upstream unique to this request (vLLM refuses an id it is already running): the
  // client's, "-", and a generated one (28 hex digits); the client's own stays the request's id.
  const std::string up = r.ctx.upstream_request_id;
  ASSERT_EQ(up.size(), std::string("abc-123-").size() + 28) << up;
  EXPECT_TRUE(up.starts_with("abc-123-")) << up;
  EXPECT_EQ(up.find_first_not_of("0123456789abcdef", 8), std::string::npos) << up;
  EXPECT_NE(ex.last_head.find("x-request-id: " + up + "\r\n"), std::string::npos) << ex.last_head;
  EXPECT_EQ(ex.last_head.find("x-request-id: abc-123\r\n"), std::string::npos) << ex.last_head;
  EXPECT_NE(ex.last_head.find("Content-Length: "), std::string::npos);
  EXPECT_EQ(ex.last_head.find("Connection:"), std::string::npos) << "hop-by-hop fields stay here";
  EXPECT_EQ(r.ctx.request_id, "abc-123");
  EXPECT_EQ(r.ctx.upstream_id(), up);
}

// --- retries (pools.X.retry) and fallbacks (models.X.fallbacks) ---

const std::string kRetrying =
    "pools: {p: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2],"
    " retry: {attempts: 3, backoff: 1ms, max_backoff: 2ms}}}\n"
    "default_pool: p\n";
// Model m on pool p (one attempt), falling back to pool q as model m-small.
const std::string kFallback =
    "pools: {p: {endpoints: [http://127.0.0.1:1]}, q: {endpoints: [http://127.0.0.1:2]}}\n"
    "models: {m: {pool: p, fallbacks: [{pool: q, upstream_model: m-small}]}}\n";

std::string sse_event(std::string_view json) { return "data: " + std::string(json) + "\n\n"; }
const std::string kRoleChunk =
    R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})";
const std::string kHiChunk = R"({"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]})";

TEST(ProxyRetry, RetryableStatusesAreRetriedUpToAttemptsThenTheLastAnswerPassesThrough) {
  Gateway g(kRetrying);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.status = 503, .body = {R"({"error":{"message":"busy"}})"}},
               Attempt{.status = 429, .body = {R"({"error":{"message":"slow down"}})"}},
               Attempt{.status = 502, .body = {R"({"error":{"message":"bad gateway"}})"}}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.starts, 3);
  EXPECT_EQ(r.ctx.retries, 2u);
  EXPECT_EQ(r.ctx.status, 502) << "the last attempt's own answer";
  EXPECT_NE(r.response.find("bad gateway"), std::string::npos) << r.response;
  EXPECT_EQ(r.ctx.attempt_count, 3u);
  EXPECT_EQ(r.ctx.attempt_log[0].status, 503);
  EXPECT_EQ(r.ctx.attempt_log[1].status, 429);
  EXPECT_EQ(r.ctx.attempt_log[2].status, 502);
  EXPECT_EQ(g.worker->metrics().retries(routing::RetryReason::status), 2u);
}

TEST(ProxyRetry, ASuccessAfterRetriesIsTheAnswer) {
  Gateway g(kRetrying);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.start = UpstreamFailure::reset}, Attempt{.status = 503, .body = {"{}"}},
               Attempt{.body = {R"({"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}})"}}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.starts, 3);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_TRUE(r.ctx.has_usage);
  EXPECT_EQ(r.response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r.response;
  EXPECT_EQ(g.worker->metrics().retries(routing::RetryReason::reset), 1u);
}

TEST(ProxyRetry, OtherClientErrorsAreNeverRetried) {
  Gateway g(kRetrying);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.status = 400, .body = {R"({"error":{"message":"bad"}})"}}, Attempt{}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(r.ctx.status, 400);
}

TEST(ProxyRetry, ARetryAfterBeyondTheCapIsNotWaitedFor) {
  Gateway g(kRetrying);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.status = 429, .body = {"{}"}, .retry_after = "30"}, Attempt{}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(r.ctx.status, 429);
}

TEST(ProxyFallback, APrimaryThatAnswers503GoesToTheFallbackUnderItsUpstreamName) {
  Gateway g(kFallback);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.status = 503, .body = {"{}"}}, Attempt{.body = {"{}"}}};
  Served r;
  serve(g, ex, chat(false), r);
  ASSERT_EQ(ex.starts, 2);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_EQ(r.ctx.pool, 1);
  EXPECT_EQ(ex.bodies[0].find("m-small"), std::string::npos);
  EXPECT_NE(ex.bodies[1].find(R"("model":"m-small")"), std::string::npos) << ex.bodies[1];
  EXPECT_EQ(g.worker->metrics().upstream_fallbacks, 1u);
  EXPECT_EQ(r.ctx.attempt_count, 2u);
  EXPECT_EQ(r.ctx.attempt_log[0].pool, 0);
  EXPECT_EQ(r.ctx.attempt_log[1].pool, 1);
}

TEST(ProxyFallback, ResetsAndRefusalsGoToTheFallbackAndAnEmptyChainIsOne502) {
  for (auto f : {UpstreamFailure::reset, UpstreamFailure::timeout}) {
    Gateway g(kFallback);
    ScriptedExchange ex(g.worker->io().get_executor());
    ex.script = {Attempt{.start = f}, Attempt{.body = {"{}"}}};
    Served r;
    serve(g, ex, chat(false), r);
    EXPECT_EQ(ex.starts, 2);
    EXPECT_EQ(r.ctx.status, 200);
  }
  Gateway g(kFallback);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.connect = UpstreamFailure::connect_refused},
               Attempt{.connect = UpstreamFailure::connect_refused}};
  Served r;
  serve(g, ex, chat(false), r);
  EXPECT_EQ(ex.connects, 2);
  EXPECT_EQ(r.ctx.status, 502);
  EXPECT_NE(r.response.find("pool `q`"), std::string::npos) << "the last target is named: " << r.response;
}

TEST(ProxyFallback, TheRequestHeaderCanTurnTheChainOff) {
  Gateway g(kFallback);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.status = 503, .body = {"{}"}}, Attempt{.body = {"{}"}}};
  std::string req = chat(false);
  req.insert(req.find("\r\n") + 2, "x-weir-fallbacks: 0\r\n");
  Served r;
  serve(g, ex, req, r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(r.ctx.status, 503);

  Gateway g2(kFallback);
  ScriptedExchange ex2(g2.worker->io().get_executor());
  std::string bad = chat(false);
  bad.insert(bad.find("\r\n") + 2, "x-weir-fallbacks: lots\r\n");
  Served r2;
  serve(g2, ex2, bad, r2);
  EXPECT_EQ(ex2.starts, 0);
  EXPECT_EQ(r2.ctx.status, 400);
}

TEST(ProxyFallback, AStreamThatFailsBeforeItsFirstTokenFailsOverWithNothingSentTwice) {
  Gateway g(kFallback);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {
      Attempt{
          .content_type = "text/event-stream", .body = {sse_event(kRoleChunk)}, .body_failure = UpstreamFailure::reset},
      Attempt{.content_type = "text/event-stream",
              .body = {sse_event(kRoleChunk) + sse_event(kHiChunk), "data: [DONE]\n\n"}}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(ex.starts, 2);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_FALSE(r.ctx.has_error) << r.ctx.error_code;
  EXPECT_EQ(r.response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r.response;
  std::size_t heads = 0, roles = 0;
  for (auto p = r.response.find("HTTP/1.1"); p != std::string::npos; p = r.response.find("HTTP/1.1", p + 1)) ++heads;
  for (auto p = r.response.find("\"role\""); p != std::string::npos; p = r.response.find("\"role\"", p + 1)) ++roles;
  EXPECT_EQ(heads, 1u);
  EXPECT_EQ(roles, 1u) << "the failed attempt's role chunk never reached the client: " << r.response;
  EXPECT_NE(r.response.find("\"Hi\""), std::string::npos);
  EXPECT_NE(r.response.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(r.response.find("\"error\""), std::string::npos) << r.response;
  EXPECT_EQ(r.ctx.events, 3u) << "only the events the client received: the fallback's role, Hi, [DONE]";
}

TEST(ProxyFallback, AfterTheFirstTokenAStreamFailureIsInBandAndNotRetried) {
  Gateway g(kFallback);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream",
                       .body = {sse_event(kRoleChunk) + sse_event(kHiChunk)},
                       .body_failure = UpstreamFailure::reset},
               Attempt{}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_TRUE(r.ctx.committed);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_EQ(r.ctx.error_code, "upstream_unavailable");
  EXPECT_NE(r.response.find("\"Hi\""), std::string::npos);
  EXPECT_NE(r.response.find("data: {\"error\""), std::string::npos) << r.response;
}

TEST(ProxyFallback, AHeldStreamThatEndsWithoutContentIsSentWhole) {
  Gateway g(kFallback);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream", .body = {sse_event(kRoleChunk), "data: [DONE]\n\n"}}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(ex.starts, 1);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_NE(r.response.find("\"role\""), std::string::npos) << r.response;
  EXPECT_NE(r.response.find("data: [DONE]"), std::string::npos) << r.response;
}

// --- endpoint health and deadlines (docs/reliability.md) ---

std::string with_header(std::string req, std::string_view line) {
  req.insert(req.find("\r\n") + 2, std::string(line) + "\r\n");
  return req;
}

const std::string kOneBreaker =
    "pools: {p: {endpoints: [http://127.0.0.1:1], eject_for: 10s, outlier: {consecutive_failures: 1},"
    " breaker: {}, timeouts: {first_token: 50ms}}}\ndefault_pool: p\n";

TEST(ProxyHealth, AStreamStalledBeforeItsFirstTokenIsCutAndCountsAgainstItsEndpoint) {
  Gateway g(kOneBreaker);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream", .hang = true}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_GE(ex.cancels, 1) << "the stalled generation is cancelled upstream";
  EXPECT_EQ(r.ctx.status, 200) << "its head went out at once (no fallback)";
  EXPECT_EQ(r.ctx.error_code, "upstream_timeout");
  EXPECT_NE(r.response.find("data: {\"error\""), std::string::npos) << r.response;
  EXPECT_NE(r.response.find("data: [DONE]"), std::string::npos) << r.response;
  EXPECT_EQ(g.worker->metrics().first_token_timeouts, 1u);
  auto& pool = g.worker->generation()->pool(0);
  EXPECT_EQ(pool.state(0, core::now()), routing::HealthState::open) << "a stall is a failed answer";
  EXPECT_EQ(pool.endpoint(0).health.cause(), routing::OpenCause::failures);
  EXPECT_EQ(pool.endpoint(0).health.trials(), 0u);
}

TEST(ProxyHealth, AStreamIsJudgedAtItsFirstTokenNotAtItsHead) {
  Gateway g(kOneBreaker);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream",
                       .body = {sse_event(kRoleChunk) + sse_event(kHiChunk), "data: [DONE]\n\n"}}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_FALSE(r.ctx.has_error) << r.ctx.error_code;
  EXPECT_EQ(g.worker->generation()->pool(0).state(0, core::now()), routing::HealthState::closed);
  EXPECT_EQ(g.worker->metrics().first_token_timeouts, 0u);
}

TEST(ProxyHealth, APoolWhoseBreakerIsOpenAnswers503AtOnceWithRetryAfter) {
  Gateway g(kOneBreaker);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.status = 500, .body = {"{}"}}};
  Served first;
  serve(g, ex, chat(false), first);
  EXPECT_EQ(first.ctx.status, 500) << "the upstream's own answer passes through";
  Served second;
  serve(g, ex, chat(false), second);
  EXPECT_EQ(ex.starts, 1) << "nothing was sent to the open endpoint";
  EXPECT_EQ(second.ctx.status, 503);
  EXPECT_EQ(second.ctx.error_code, "upstream_unavailable");
  EXPECT_NE(second.response.find("Retry-After: 10\r\n"), std::string::npos) << second.response;
  EXPECT_NE(second.response.find("circuit breaker is open"), std::string::npos) << second.response;
  EXPECT_EQ(second.response.find("127.0.0.1"), std::string::npos) << second.response;
}

TEST(ProxyDeadline, ADeadlineBeforeTheCommitPointIsA504AndAfterItEndsTheStreamInBand) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.body = {"{\"id\":"}, .hang = true}};  // a whole answer that never ends
  Served r;
  serve(g, ex, with_header(chat(false), "x-weir-timeout-ms: 50"), r);
  EXPECT_GE(ex.cancels, 1);
  EXPECT_EQ(r.ctx.status, 504);
  EXPECT_EQ(r.ctx.error_code, "deadline_exceeded");
  EXPECT_NE(r.response.find("deadline of 50 ms"), std::string::npos) << r.response;
  EXPECT_EQ(g.worker->generation()->pool(0).state(0, core::now()), routing::HealthState::closed)
      << "not the endpoint's fault";

  Gateway g2;
  ScriptedExchange ex2(g2.worker->io().get_executor());
  ex2.script = {Attempt{.content_type = "text/event-stream", .body = {sse_event(kHiChunk)}, .hang = true}};
  Served s;
  serve(g2, ex2, with_header(chat(true), "x-weir-timeout-ms: 80"), s);
  EXPECT_GE(ex2.cancels, 1);
  EXPECT_EQ(s.ctx.status, 200);
  EXPECT_EQ(s.ctx.error_code, "deadline_exceeded");
  const auto token = s.response.find("\"Hi\"");
  const auto error = s.response.find("\"deadline_exceeded\"");
  ASSERT_NE(token, std::string::npos) << s.response;
  ASSERT_NE(error, std::string::npos) << s.response;
  EXPECT_LT(token, error);
  EXPECT_NE(s.response.find("data: [DONE]"), std::string::npos) << s.response;
  EXPECT_EQ(g2.worker->metrics().deadline_exceeded, 1u);

  for (const char* bad : {"x-weir-timeout-ms: 0", "x-weir-timeout-ms: 1s", "x-weir-timeout-ms: 99999999999"}) {
    Gateway g3;
    ScriptedExchange ex3(g3.worker->io().get_executor());
    Served b;
    serve(g3, ex3, with_header(chat(false), bad), b);
    EXPECT_EQ(b.ctx.status, 400) << bad;
    EXPECT_EQ(ex3.starts, 0);
  }
}

// --- how a stream ends (docs/reliability.md: an OpenAI stream is complete at its [DONE]) ---

std::size_t occurrences(std::string_view hay, std::string_view needle) {
  std::size_t n = 0;
  for (auto i = hay.find(needle); i != std::string_view::npos; i = hay.find(needle, i + 1)) ++n;
  return n;
}

const std::string kFinishChunk = R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})";
const std::string kUsageChunk = R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}})";

TEST(ProxyStreamEnd, ABodyThatEndsWithoutDoneIsABrokenStreamAfterItsTokens) {
  // Even after its finish_reason and usage: the wire contract's end is [DONE].
  for (const bool finished : {false, true}) {
    SCOPED_TRACE(finished);
    Gateway g;
    ScriptedExchange ex(g.worker->io().get_executor());
    std::string body = sse_event(kRoleChunk) + sse_event(kHiChunk);
    if (finished) body += sse_event(kFinishChunk) + sse_event(kUsageChunk);
    ex.script = {Attempt{.content_type = "text/event-stream", .body = {body}}, Attempt{}};
    Served r;
    serve(g, ex, chat(true), r);
    EXPECT_EQ(ex.starts, 1) << "never sent again after the commit point";
    EXPECT_EQ(r.ctx.status, 200);
    EXPECT_EQ(r.ctx.error_code, "upstream_unavailable");
    EXPECT_EQ(r.ctx.error_source, core::ErrorSource::upstream);
    const auto token = r.response.find("\"Hi\"");
    const auto error = r.response.find("data: {\"error\"");
    ASSERT_NE(token, std::string::npos) << r.response;
    ASSERT_NE(error, std::string::npos) << r.response;
    EXPECT_LT(token, error);
    EXPECT_LT(error, r.response.find("data: [DONE]"));
    EXPECT_NE(r.response.find("ended the stream before it was complete"), std::string::npos) << r.response;
    EXPECT_EQ(occurrences(r.response, "\"Hi\""), 1u);
    EXPECT_EQ(occurrences(r.response, "data: [DONE]"), 1u);
    EXPECT_EQ(occurrences(r.response, "\"usage\""), 0u) << "Weir asked for it: not the client's";
    EXPECT_NE(r.response.find("0\r\n\r\n"), std::string::npos) << "the chunked body ends";
    EXPECT_EQ(r.ctx.events, (finished ? 3u : 2u) + 2u) << "and Weir's error event and [DONE]";
    EXPECT_EQ(r.ctx.has_usage, finished) << "a usage that came is kept for metering";
    EXPECT_EQ(r.ctx.usage.completion_tokens, finished ? 1u : 0u);
    ASSERT_EQ(r.ctx.attempt_count, 1);
    EXPECT_EQ(r.ctx.attempt_log[0].failure, UpstreamFailure::protocol);
    EXPECT_EQ(g.worker->metrics().upstream_failures(UpstreamFailure::protocol), 1u);
  }
}

TEST(ProxyStreamEnd, AHeldStreamThatEndsWithoutDoneOrContentFailsOver) {
  Gateway g(kFallback);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream", .body = {sse_event(kRoleChunk)}},
               Attempt{.content_type = "text/event-stream",
                       .body = {sse_event(kRoleChunk) + sse_event(kHiChunk), "data: [DONE]\n\n"}}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(ex.starts, 2);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_FALSE(r.ctx.has_error) << r.ctx.error_code;
  EXPECT_EQ(occurrences(r.response, "HTTP/1.1"), 1u);
  EXPECT_EQ(occurrences(r.response, "\"role\""), 1u) << r.response;
  EXPECT_EQ(occurrences(r.response, "data: [DONE]"), 1u);
  EXPECT_EQ(r.response.find("\"error\""), std::string::npos) << r.response;
  ASSERT_EQ(r.ctx.attempt_count, 2);
  EXPECT_EQ(r.ctx.attempt_log[0].failure, UpstreamFailure::protocol);
  EXPECT_EQ(r.ctx.attempt_log[1].failure, UpstreamFailure::none);
}

TEST(ProxyStreamEnd, NothingAfterDoneReachesTheClient) {
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream",
                       .body = {sse_event(kRoleChunk) + sse_event(kHiChunk) + "data: [DONE]\n\n" +
                                    sse_event(R"({"choices":[{"index":0,"delta":{"content":"AFTER"}}]})"),
                                ": late\n\n" + sse_event(kUsageChunk) + "data: [DONE]\n\n"}}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_FALSE(r.ctx.has_error) << r.ctx.error_code;
  EXPECT_EQ(occurrences(r.response, "data: [DONE]"), 1u) << r.response;
  EXPECT_EQ(r.response.find("AFTER"), std::string::npos) << r.response;
  EXPECT_EQ(r.response.find(": late"), std::string::npos) << r.response;
  EXPECT_EQ(r.ctx.events, 3u);
  EXPECT_FALSE(r.ctx.has_usage) << "what came after [DONE] is not read";
}

TEST(ProxyStreamEnd, AStreamOnARouteWithoutTheDoneContractEndsWithItsBody) {
  // A stream on a route with no [DONE] contract (here: an audio transcription) that just ends is complete.
  Gateway g;
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream",
                       .body = {sse_event(R"({"type":"transcript.text.delta","delta":"hi"})")}}};
  const std::string form =
      "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
      "--b\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n"
      "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
      "Content-Type: audio/wav\r\n\r\nRIFF\r\n--b--\r\n";
  Served r;
  serve(g, ex,
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        "Content-Length: " +
            std::to_string(form.size()) + "\r\nConnection: close\r\n\r\n" + form,
        r);
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_FALSE(r.ctx.has_error) << r.ctx.error_code;
  EXPECT_EQ(r.response.find("\"error\""), std::string::npos) << r.response;
  EXPECT_NE(r.response.find("transcript.text.delta"), std::string::npos) << r.response;
  EXPECT_TRUE(r.ctx.stream);
}

}  // namespace
}  // namespace weir::gateway

namespace weir::gateway {
namespace {

// Resume mid-stream (pools.X.resume): the continuation request and what the client's one stream becomes.
const std::string kResuming =
    "pools: {p: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2], resume: true}}\ndefault_pool: p\n";

std::string resume_chunk(std::string_view id, std::string_view delta, std::string_view finish = "null") {
  return "data: {\"id\":\"" + std::string(id) +
         "\",\"object\":\"chat.completion.chunk\",\"created\":" + (id == "a" ? "1" : "2") +
         ",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":" + std::string(delta) +
         ",\"logprobs\":null,\"finish_reason\":" + std::string(finish) + "}]}\n\n";
}

std::string chat_body(std::string_view body) {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + std::string(body);
}

TEST(ProxyResume, ABrokenStreamGoesOnFromTheOtherEndpointAsOneStream) {
  Gateway g(kResuming);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {
      Attempt{.content_type = "text/event-stream",
              .body = {resume_chunk("a", R"({"role":"assistant","content":""})") +
                       resume_chunk("a", R"({"content":" H\u00e9"})") + resume_chunk("a", R"({"content":" \"x\""})")},
              .body_failure = UpstreamFailure::reset},
      Attempt{.content_type = "text/event-stream",
              .body = {resume_chunk("b", R"({"role":"assistant","content":""})") +
                           resume_chunk("b", R"({"content":" there"})", R"("stop")"),
                       R"(data: {"id":"b","object":"chat.completion.chunk","created":2,"model":"m","choices":[],)"
                       R"("usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}})"
                       "\n\ndata: [DONE]\n\n"}}};
  Served r;
  serve(g, ex,
        chat_body(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":10,)"
                  R"("stream_options":{"include_usage":true}})"),
        r);
  ASSERT_EQ(ex.starts, 2);
  const auto cont = boost::json::parse(ex.bodies[1]).as_object();
  const auto& msgs = cont.at("messages").as_array();
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[1].at("role").as_string(), "assistant");
  EXPECT_EQ(msgs[1].at("content").as_string(), " H\u00e9 \"x\"");
  EXPECT_EQ(cont.at("continue_final_message").as_bool(), true);
  EXPECT_EQ(cont.at("add_generation_prompt").as_bool(), false);
  EXPECT_EQ(cont.at("max_tokens").as_int64(), 8);
  // the client: one head, one role chunk, one id, no error, one [DONE], the usage of the whole message
  EXPECT_EQ(r.response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r.response;
  EXPECT_EQ(r.response.find("HTTP/1.1", 1), std::string::npos);
  const auto count = [&](std::string_view s) {
    std::size_t n = 0;
    for (auto i = r.response.find(s); i != std::string::npos; i = r.response.find(s, i + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"role\""), 1u) << r.response;
  EXPECT_EQ(count("\"id\":\"b\""), 0u) << r.response;
  EXPECT_EQ(count("\"created\":2"), 0u) << r.response;
  EXPECT_EQ(count("data: [DONE]"), 1u);
  EXPECT_EQ(count("\"error\""), 0u);
  EXPECT_NE(r.response.find(R"("prompt_tokens":10,"total_tokens":13,"completion_tokens":3)"), std::string::npos)
      << r.response;
  EXPECT_LT(r.response.find(R"(\"x\")"), r.response.find("\" there\""));
  EXPECT_EQ(r.ctx.status, 200);
  EXPECT_FALSE(r.ctx.has_error);
  EXPECT_EQ(r.ctx.usage.prompt_tokens, 10u);
  EXPECT_EQ(r.ctx.usage.completion_tokens, 3u);
  ASSERT_EQ(r.ctx.attempt_count, 2);
  EXPECT_EQ(r.ctx.attempt_log[0].failure, UpstreamFailure::reset);
  EXPECT_FALSE(r.ctx.attempt_log[0].resume);
  EXPECT_TRUE(r.ctx.attempt_log[1].resume);
  EXPECT_NE(r.ctx.attempt_log[0].endpoint, r.ctx.attempt_log[1].endpoint);
  EXPECT_EQ(r.ctx.retries, 1u);
  EXPECT_EQ(g.worker->metrics().upstream_resumes, 1u);
}

TEST(ProxyResume, WithResumeOffOrAToolCallInFlightTheStreamEndsInBand) {
  for (const bool tool : {false, true}) {
    Gateway g(tool ? kResuming
                   : std::string("pools: {p: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2]}}\n"
                                 "default_pool: p\n"));
    ScriptedExchange ex(g.worker->io().get_executor());
    std::string body =
        resume_chunk("a", R"({"role":"assistant","content":""})") + resume_chunk("a", R"({"content":" Hi"})");
    if (tool) body += resume_chunk("a", R"({"tool_calls":[{"index":0,"id":"c","function":{"name":"f"}}]})");
    ex.script = {Attempt{.content_type = "text/event-stream", .body = {body}, .body_failure = UpstreamFailure::reset},
                 Attempt{}};
    Served r;
    serve(g, ex, chat(true), r);
    EXPECT_EQ(ex.starts, 1) << tool;
    EXPECT_EQ(r.ctx.error_code, "upstream_unavailable");
    EXPECT_NE(r.response.find("data: {\"error\""), std::string::npos) << r.response;
    EXPECT_NE(r.response.find("data: [DONE]"), std::string::npos);
    EXPECT_EQ(g.worker->metrics().upstream_resumes, 0u);
  }
}

TEST(ProxyResume, AStreamThatEndsWithoutDoneAfterContentIsResumedAndOneThatLostOnlyItsDoneGetsIt) {
  for (const bool finished : {false, true}) {
    SCOPED_TRACE(finished);
    Gateway g(kResuming);
    ScriptedExchange ex(g.worker->io().get_executor());
    std::string first =
        resume_chunk("a", R"({"role":"assistant","content":""})") + resume_chunk("a", R"({"content":" Hi"})");
    if (finished) first += resume_chunk("a", "{}", R"("stop")");
    ex.script = {Attempt{.content_type = "text/event-stream", .body = {first}},
                 Attempt{.content_type = "text/event-stream",
                         .body = {resume_chunk("b", R"({"role":"assistant","content":""})") +
                                  resume_chunk("b", R"({"content":" there"})", R"("stop")") + "data: [DONE]\n\n"}}};
    Served r;
    serve(g, ex, chat(true), r);
    EXPECT_EQ(ex.starts, finished ? 1 : 2) << "a finished generation is not generated again";
    EXPECT_EQ(r.ctx.status, 200);
    EXPECT_FALSE(r.ctx.has_error) << r.ctx.error_code;
    EXPECT_EQ(occurrences(r.response, "\"error\""), 0u) << r.response;
    EXPECT_EQ(occurrences(r.response, "data: [DONE]"), 1u) << r.response;
    EXPECT_EQ(occurrences(r.response, "\" Hi\""), 1u) << r.response;
    EXPECT_EQ(occurrences(r.response, "\"finish_reason\":\"stop\""), 1u) << r.response;
    EXPECT_EQ(occurrences(r.response, "\" there\""), finished ? 0u : 1u) << r.response;
    EXPECT_EQ(r.ctx.attempt_log[0].failure, UpstreamFailure::protocol);
    EXPECT_EQ(g.worker->metrics().upstream_resumes, finished ? 0u : 1u);
  }
}

TEST(ProxyResume, AContinuationAnsweredWithAnErrorLeavesTheInBandError) {
  Gateway g(kResuming);
  ScriptedExchange ex(g.worker->io().get_executor());
  ex.script = {Attempt{.content_type = "text/event-stream",
                       .body = {resume_chunk("a", R"({"role":"assistant","content":""})") +
                                resume_chunk("a", R"({"content":" Hi"})")},
                       .body_failure = UpstreamFailure::reset},
               Attempt{.status = 400, .body = {R"({"error":{"message":"continue_final_message?"}})"}}};
  Served r;
  serve(g, ex, chat(true), r);
  EXPECT_EQ(ex.starts, 2);
  EXPECT_EQ(r.response.find("continue_final_message?"), std::string::npos) << r.response;
  EXPECT_NE(r.response.find("data: {\"error\""), std::string::npos) << r.response;
  EXPECT_NE(r.response.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(r.ctx.error_code, "upstream_unavailable");
  EXPECT_EQ(g.worker->metrics().upstream_resumes, 0u);
}

}  // namespace
}  // namespace weir::gateway
