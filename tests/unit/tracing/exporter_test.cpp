// The OTLP/HTTP JSON encoding of a request's spans, and the exporter's
// batches, retries and drops against a small collector in the test.
#include "tracing/exporter.hpp"

#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

namespace weir::tracing {
namespace {

namespace asio = boost::asio;
namespace bh = boost::beast::http;
namespace json = boost::json;
using namespace std::chrono_literals;

// An OTLP/HTTP receiver on a free port: answers each POST with the next
// scripted status (then 200) and keeps the bodies.
class Collector {
 public:
  Collector() : acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    thread_ = std::thread([this] { serve(); });
  }
  ~Collector() {
    stopping_ = true;
    boost::system::error_code ec;
    // Wake the blocking accept with a connection of our own.
    asio::ip::tcp::socket s(io_);
    s.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  void script(std::deque<int> statuses) {
    std::lock_guard l(mu_);
    script_ = std::move(statuses);
  }
  std::vector<std::string> bodies() {
    std::lock_guard l(mu_);
    return bodies_;
  }
  std::vector<std::string> headers(std::string_view name) {
    std::lock_guard l(mu_);
    std::vector<std::string> out;
    for (const auto& h : heads_) out.emplace_back(h[name]);
    return out;
  }

 private:
  void serve() {
    while (!stopping_) {
      asio::ip::tcp::socket sock(io_);
      boost::system::error_code ec;
      acceptor_.accept(sock, ec);
      if (ec || stopping_) return;
      boost::beast::flat_buffer buf;
      for (;;) {
        bh::request<bh::string_body> req;
        bh::read(sock, buf, req, ec);
        if (ec) break;
        int status = 200;
        {
          std::lock_guard l(mu_);
          bodies_.push_back(req.body());
          heads_.push_back(req.base());
          if (!script_.empty()) {
            status = script_.front();
            script_.pop_front();
          }
        }
        bh::response<bh::string_body> res{static_cast<bh::status>(status), 11};
        res.set(bh::field::content_type, "application/json");
        res.body() = status == 200 ? "{}" : R"({"code":14,"message":"unavailable"})";
        if (status == 503) res.set(bh::field::retry_after, "0");
        res.prepare_payload();
        bh::write(sock, res, ec);
        if (ec) break;
      }
    }
  }
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::deque<int> script_;
  std::vector<std::string> bodies_;
  std::vector<bh::request_header<>> heads_;
};

TracingConfig config_for(std::uint16_t port) {
  TracingConfig c;
  auto ep = core::parse_endpoint_url("http://127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(ep);
  c.endpoint = *ep;
  c.target = "/v1/traces";
  c.batch = 4;
  c.queue = 16;
  c.timeout = 2s;
  c.headers = {{"x-api-key", "k1"}};
  return c;
}

Resource resource() {
  Resource r;
  r.service_name = "weir-test";
  r.service_version = "0.1.0";
  r.instance_id = "00000000000000ff";
  r.extra = {{"deployment.environment", "test"}};
  return r;
}

// A streamed chat completion: authenticate, admit, one failed attempt, one that answered, the stream.
void fill(TraceRecord& r, IdGenerator& g, bool with_parent) {
  r.trace_id = g.trace_id();
  r.span_id = g.span_id();
  r.parent_id = with_parent ? g.span_id() : SpanId{};
  r.tracestate = with_parent ? "congo=t61rcWkgMzE" : "";
  r.start_unix_ns = 1'764'630'000'000'000'000;
  r.duration_ns = 800'000'000;
  r.method = "POST";
  r.path = "/v1/chat/completions";
  r.route = "/v1/chat/completions";
  r.operation = "chat";
  r.request_id = "req-1";
  r.model = "llama \"3\"";
  r.tenant = "acme";
  r.key_id = "acme-1";
  r.user_agent = "OpenAI/Python 1.50.0";
  r.status = 200;
  r.stream = true;
  r.has_usage = true;
  r.prompt_tokens = 12;
  r.completion_tokens = 48;
  r.cached_tokens = 4;
  r.ttft_ns = 90'500'000;
  r.has_spend = true;
  r.spend_nano_usd = 22'000;
  r.events = 50;
  r.child_count = 0;
  auto add = [&](Step s, std::int64_t from, std::int64_t to) {
    ChildSpan* c = r.add_child();
    c->id = g.span_id();
    c->step = s;
    c->start_ns = from;
    c->end_ns = to;
    c->error = false;
    c->status = 0;
    c->failure = {};
    c->resend = 0;
    return c;
  };
  add(Step::authenticate, 10'000, 20'000);
  add(Step::admit, 30'000, 40'000);
  auto* a1 = add(Step::upstream, 50'000, 60'000);
  a1->failure = "connect_refused";
  a1->pool = "p";
  a1->url = "http://10.0.0.1:8000";
  a1->host = "10.0.0.1";
  a1->port = 8000;
  auto* a2 = add(Step::upstream, 70'000, 799'000'000);
  a2->status = 200;
  a2->resend = 1;
  a2->pool = "p";
  a2->url = "http://10.0.0.2:8000";
  a2->host = "10.0.0.2";
  a2->port = 8000;
  add(Step::response, 89'000'000, 799'000'000);
}

std::map<std::string, json::value> attrs(const json::object& span) {
  std::map<std::string, json::value> out;
  for (const auto& a : span.at("attributes").as_array()) {
    const auto& o = a.as_object();
    const auto& v = o.at("value").as_object();
    out[std::string(o.at("key").as_string())] = v.begin()->value();
  }
  return out;
}

TEST(OtlpJsonTest, EncodesARequestsSpansWithSemanticConventions) {
  IdGenerator g(1);
  TraceRecord r;
  fill(r, g, true);
  std::string out;
  const TraceRecord* rs[] = {&r};
  append_export_request(out, resource_json(resource()), "0.1.0", rs);
  const auto doc = json::parse(out).as_object();  // valid JSON
  const auto& rsp = doc.at("resourceSpans").as_array().at(0).as_object();
  std::map<std::string, std::string> res;
  for (const auto& a : rsp.at("resource").as_object().at("attributes").as_array())
    res[std::string(a.at("key").as_string())] = std::string(a.at("value").at("stringValue").as_string());
  EXPECT_EQ(res["service.name"], "weir-test");
  EXPECT_EQ(res["service.instance.id"], "00000000000000ff");
  EXPECT_EQ(res["deployment.environment"], "test");
  const auto& scope = rsp.at("scopeSpans").as_array().at(0).as_object();
  EXPECT_EQ(scope.at("scope").at("name").as_string(), "weir");
  const auto& spans = scope.at("spans").as_array();
  ASSERT_EQ(spans.size(), 6u);
  std::string trace, span, parent;
  append_hex(trace, r.trace_id);
  append_hex(span, r.span_id);
  append_hex(parent, r.parent_id);
  const auto& root = spans[0].as_object();
  EXPECT_EQ(root.at("traceId").as_string(), trace);
  EXPECT_EQ(root.at("spanId").as_string(), span);
  EXPECT_EQ(root.at("parentSpanId").as_string(), parent);
  EXPECT_EQ(root.at("traceState").as_string(), "congo=t61rcWkgMzE");
  EXPECT_EQ(root.at("name").as_string(), "POST /v1/chat/completions");
  EXPECT_EQ(root.at("kind").as_int64(), 2);  // SERVER
  EXPECT_EQ(root.at("startTimeUnixNano").as_string(), "1764630000000000000");
  EXPECT_EQ(root.at("endTimeUnixNano").as_string(), "1764630000800000000");
  auto a = attrs(root);
  EXPECT_EQ(a["http.request.method"].as_string(), "POST");
  EXPECT_EQ(a["http.route"].as_string(), "/v1/chat/completions");
  EXPECT_EQ(a["http.response.status_code"].as_string(), "200");  // int64 in JSON: a string
  EXPECT_EQ(a["gen_ai.operation.name"].as_string(), "chat");
  EXPECT_EQ(a["gen_ai.request.model"].as_string(), "llama \"3\"");
  EXPECT_EQ(a["gen_ai.usage.input_tokens"].as_string(), "12");
  EXPECT_EQ(a["gen_ai.usage.output_tokens"].as_string(), "48");
  EXPECT_EQ(a["gen_ai.usage.cache_read.input_tokens"].as_string(), "4");
  EXPECT_DOUBLE_EQ(a["gen_ai.response.time_to_first_chunk"].as_double(), 0.0905);
  EXPECT_EQ(a["weir.tenant"].as_string(), "acme");
  EXPECT_EQ(a["user_agent.original"].as_string(), "OpenAI/Python 1.50.0");
  EXPECT_EQ(root.at("status").at("code").as_int64(), 0);
  // Children: the request span is their parent; names and kinds.
  std::vector<std::string> names;
  for (std::size_t i = 1; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].at("parentSpanId").as_string(), span);
    EXPECT_EQ(spans[i].at("traceId").as_string(), trace);
    names.emplace_back(spans[i].at("name").as_string());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"authenticate", "admit", "POST", "POST", "stream"}));
  const auto& failed = spans[3].as_object();
  EXPECT_EQ(failed.at("kind").as_int64(), 3);  // CLIENT
  EXPECT_EQ(failed.at("status").at("code").as_int64(), 2);
  auto fa = attrs(failed);
  EXPECT_EQ(fa["error.type"].as_string(), "connect_refused");
  EXPECT_EQ(fa["server.address"].as_string(), "10.0.0.1");
  EXPECT_EQ(fa["server.port"].as_string(), "8000");
  EXPECT_EQ(fa.count("http.request.resend_count"), 0u);
  auto ok = attrs(spans[4].as_object());
  EXPECT_EQ(ok["http.response.status_code"].as_string(), "200");
  EXPECT_EQ(ok["http.request.resend_count"].as_string(), "1");
  EXPECT_EQ(spans[4].at("status").at("code").as_int64(), 0);
  auto st = attrs(spans[5].as_object());
  EXPECT_EQ(st["gen_ai.usage.output_tokens"].as_string(), "48");
  EXPECT_EQ(st["weir.sse_events"].as_string(), "50");
}

TEST(OtlpJsonTest, ServerSpanErrorsOnlyFor5xxAndRootsHaveNoParent) {
  IdGenerator g(2);
  TraceRecord r;
  fill(r, g, false);
  r.status = 429;
  r.has_error = true;
  r.error_source = "client";
  r.error_code = "rate_limit_exceeded";
  std::string out;
  const TraceRecord* rs[] = {&r};
  append_export_request(out, resource_json(resource()), "0.1.0", rs);
  auto spans = json::parse(out).at("resourceSpans").at(0).at("scopeSpans").at(0).at("spans").as_array();
  EXPECT_FALSE(spans[0].as_object().contains("parentSpanId"));
  EXPECT_FALSE(spans[0].as_object().contains("traceState"));
  EXPECT_EQ(spans[0].at("status").at("code").as_int64(), 0);  // a 4xx is not the server's error
  r.status = 502;
  r.error_source = "upstream";
  r.error_code = "upstream_connect_failed";
  out.clear();
  append_export_request(out, resource_json(resource()), "0.1.0", rs);
  spans = json::parse(out).at("resourceSpans").at(0).at("scopeSpans").at(0).at("spans").as_array();
  EXPECT_EQ(spans[0].at("status").at("code").as_int64(), 2);
  EXPECT_EQ(attrs(spans[0].as_object())["error.type"].as_string(), "upstream_connect_failed");
}

std::vector<json::value> encode(const TraceRecord& r) {
  std::string out;
  const TraceRecord* rs[] = {&r};
  append_export_request(out, resource_json(resource()), "0.1.0", rs);
  const auto spans = json::parse(out).at("resourceSpans").at(0).at("scopeSpans").at(0).at("spans").as_array();
  return {spans.begin(), spans.end()};
}

TEST(OtlpJsonTest, A2xxThatEndedInAnUpstreamOrWeirErrorIsAnErrorSpan) {
  // HTTP semconv: a 1xx-3xx response that ends in another error (a stream broken after its head) is ERROR.
  IdGenerator g(4);
  TraceRecord r;
  fill(r, g, true);
  r.has_error = true;
  r.error_source = "upstream";
  r.error_code = "upstream_unavailable";
  auto spans = encode(r);
  EXPECT_EQ(spans[0].at("status").at("code").as_int64(), 2);
  EXPECT_EQ(spans[0].at("status").at("message").as_string(), "upstream_unavailable");
  EXPECT_EQ(attrs(spans[0].as_object())["error.type"].as_string(), "upstream_unavailable");
  r.error_source = "internal";
  r.error_code = "internal_error";
  EXPECT_EQ(encode(r)[0].at("status").at("code").as_int64(), 2);
  // The client's doing stays unset: a client-side error, and 499 (the client left mid-stream).
  r.error_source = "client";
  r.error_code = "client_closed_request";
  spans = encode(r);
  EXPECT_EQ(spans[0].at("status").at("code").as_int64(), 0);
  EXPECT_EQ(attrs(spans[0].as_object()).count("error.type"), 0u);
  r.status = 499;
  EXPECT_EQ(encode(r)[0].at("status").at("code").as_int64(), 0);
}

TEST(OtlpJsonTest, ABatchMembersAttemptLinksToTheContextItsBatchSent) {
  IdGenerator g(5);
  TraceRecord r;
  fill(r, g, true);
  ChildSpan& attempt = r.children[3];  // the second upstream attempt (fill)
  ASSERT_EQ(attempt.step, Step::upstream);
  attempt.batch_lead = 0;
  attempt.link_trace = g.trace_id();
  attempt.link_span = g.span_id();
  std::string lt, ls;
  append_hex(lt, attempt.link_trace);
  append_hex(ls, attempt.link_span);
  auto spans = encode(r);
  const auto& s = spans[4].as_object();
  EXPECT_EQ(attrs(s)["weir.batch.lead"].as_bool(), false);
  const auto& links = s.at("links").as_array();
  ASSERT_EQ(links.size(), 1u);
  EXPECT_EQ(links[0].at("traceId").as_string(), lt);
  EXPECT_EQ(links[0].at("spanId").as_string(), ls);
  // The lead (its own context went): no link. Not a batch's attempt: neither attribute nor link.
  attempt.batch_lead = 1;
  attempt.link_span = {};
  spans = encode(r);
  EXPECT_EQ(attrs(spans[4].as_object())["weir.batch.lead"].as_bool(), true);
  EXPECT_FALSE(spans[4].as_object().contains("links"));
  EXPECT_EQ(attrs(spans[3].as_object()).count("weir.batch.lead"), 0u);
}

TEST(OtlpJsonTest, GenAiProviderUrlFullRedactedAndCacheReadOnlyWhenReported) {
  IdGenerator g(6);
  TraceRecord r;
  fill(r, g, true);
  r.provider = "openai";
  r.children[3].provider = "openai";
  r.children[3].url = "https://u:p@10.0.0.2:8000/openai/deployments/d/chat/completions?api-key=s3cret&v=1";
  r.cached_tokens = 0;
  const auto spans = encode(r);
  auto a = attrs(spans[0].as_object());
  EXPECT_EQ(a["gen_ai.provider.name"].as_string(), "openai");
  EXPECT_EQ(a.count("gen_ai.usage.cache_read.input_tokens"), 0u);  // none reported
  auto c = attrs(spans[4].as_object());
  EXPECT_EQ(c["gen_ai.provider.name"].as_string(), "openai");
  EXPECT_EQ(c["url.full"].as_string(),
            "https://10.0.0.2:8000/openai/deployments/d/chat/completions?api-key=REDACTED&v=1");
}

// HTTP semantic conventions (http.request.method): a method outside RFC 9110's and PATCH, compared as written,
// is "_OTHER" with the token in http.request.method_original, and the span's name says "HTTP" in its place: a
// client cannot mint span names (or method values) by inventing methods.
TEST(OtlpJsonTest, AnUnknownMethodIsOtherAndItsSpanNamedHttp) {
  IdGenerator g(7);
  for (const std::string& method : std::vector<std::string>{"MFOO", "get", "PROPFIND", std::string(300, 'X')}) {
    TraceRecord r;
    fill(r, g, true);
    r.method = method;
    const auto spans = encode(r);
    const auto& root = spans[0].as_object();
    EXPECT_EQ(root.at("name").as_string(), "HTTP /v1/chat/completions") << method;
    auto a = attrs(root);
    EXPECT_EQ(a["http.request.method"].as_string(), "_OTHER");
    EXPECT_EQ(a["http.request.method_original"].as_string(), method.substr(0, 256));
    EXPECT_EQ(spans[3].at("name").as_string(), "HTTP");  // the attempts' CLIENT spans too
    EXPECT_EQ(attrs(spans[3].as_object())["http.request.method"].as_string(), "_OTHER");
  }
  for (const std::string method : {"GET", "PATCH", "DELETE", "OPTIONS", "HEAD", "PUT", "TRACE", "CONNECT"}) {
    TraceRecord r;
    fill(r, g, true);
    r.method = method;
    r.route = {};  // no route matched: the method alone
    const auto spans = encode(r);
    EXPECT_EQ(spans[0].at("name").as_string(), method);
    auto a = attrs(spans[0].as_object());
    EXPECT_EQ(a["http.request.method"].as_string(), method);
    EXPECT_EQ(a.count("http.request.method_original"), 0u);
  }
}

// OTLP (common.proto): a resource's keys are unique. One that tracing.resource names and Weir sets too is the
// configured value, once.
TEST(OtlpJsonTest, AConfiguredResourceAttributeReplacesTheBuiltInOne) {
  Resource r = resource();
  r.host_name = "pod-7f9c";
  r.extra = {{"host.name", "node-3"},
             {"service.version", "2.3.4"},
             {"telemetry.sdk.language", "c++"},
             {"deployment.environment", "prod"}};
  const auto doc = json::parse(std::string("{\"resource\":") + resource_json(r) + "}");
  std::vector<std::string> keys;
  std::map<std::string, std::string> got;
  for (const auto& a : doc.at("resource").at("attributes").as_array()) {
    keys.emplace_back(a.at("key").as_string());
    got[keys.back()] = std::string(a.at("value").at("stringValue").as_string());
  }
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size());
  EXPECT_EQ(got["host.name"], "node-3");
  EXPECT_EQ(got["service.version"], "2.3.4");
  EXPECT_EQ(got["telemetry.sdk.language"], "c++");
  EXPECT_EQ(got["telemetry.sdk.version"], "0.1.0");  // not named: Weir's
  EXPECT_EQ(got["service.instance.id"], "00000000000000ff");
  EXPECT_EQ(got["service.name"], "weir-test");
}

bool push(Exporter& e, unsigned worker, IdGenerator& g) {
  TraceQueue& q = e.queue(worker);
  TraceRecord* r = q.begin_push();
  if (!r) {
    q.drop(6);
    return false;
  }
  fill(*r, g, false);
  q.commit();
  return true;
}

std::size_t spans_in(const std::string& body) {
  return json::parse(body).at("resourceSpans").at(0).at("scopeSpans").at(0).at("spans").as_array().size();
}

TEST(ExporterTest, BatchesFromEveryQueueAndSendsHeaders) {
  Collector c;
  Exporter e(config_for(c.port()), 2, resource());
  IdGenerator g(3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(push(e, 0, g));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(push(e, 1, g));
  EXPECT_EQ(e.stats().queued, 6u);
  EXPECT_EQ(e.export_batch(std::chrono::steady_clock::now() + 5s), 4u);  // batch: 4 traces
  EXPECT_EQ(e.export_batch(std::chrono::steady_clock::now() + 5s), 2u);
  EXPECT_EQ(e.export_batch(std::chrono::steady_clock::now() + 5s), 0u);
  const auto bodies = c.bodies();
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_EQ(spans_in(bodies[0]), 24u);
  EXPECT_EQ(spans_in(bodies[1]), 12u);
  EXPECT_EQ(c.headers("x-api-key"), (std::vector<std::string>{"k1", "k1"}));
  EXPECT_EQ(c.headers("content-type")[0], "application/json");
  const auto s = e.stats();
  EXPECT_EQ(s.exported, 36u);
  EXPECT_EQ(s.export_requests, 2u);
  EXPECT_EQ(s.export_errors, 0u);
  EXPECT_EQ(s.queued, 0u);
}

TEST(ExporterTest, RetriesRetryableAnswersThenDropsAndCounts) {
  Collector c;
  c.script({503, 200});  // one retry succeeds
  Exporter e(config_for(c.port()), 1, resource());
  IdGenerator g(4);
  ASSERT_TRUE(push(e, 0, g));
  EXPECT_EQ(e.export_batch(std::chrono::steady_clock::now() + 10s), 1u);
  EXPECT_EQ(c.bodies().size(), 2u);
  EXPECT_EQ(c.bodies()[0], c.bodies()[1]);  // the same batch again
  EXPECT_EQ(e.stats().exported, 6u);
  EXPECT_EQ(e.stats().export_errors, 1u);
  // A 400 is final: the batch is dropped at once, counted.
  c.script({400});
  ASSERT_TRUE(push(e, 0, g));
  e.export_batch(std::chrono::steady_clock::now() + 10s);
  EXPECT_EQ(c.bodies().size(), 3u);
  EXPECT_EQ(e.stats().dropped_export, 6u);
}

TEST(ExporterTest, ACollectorThatIsDownCostsDropsNotWaits) {
  std::uint16_t port;
  {
    Collector c;
    port = c.port();
  }  // closed: connections are refused
  auto cfg = config_for(port);
  Exporter e(cfg, 1, resource());
  IdGenerator g(5);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(push(e, 0, g));
  EXPECT_FALSE(push(e, 0, g));  // the queue is full: the worker drops and counts, never waits
  EXPECT_EQ(e.stats().dropped_queue_full, 6u);
  e.export_batch(std::chrono::steady_clock::now() + 200ms);
  EXPECT_EQ(e.stats().dropped_export, 24u);
  EXPECT_GE(e.stats().export_errors, 1u);
}

TEST(ExporterTest, ThreadExportsAndDrainsOnStop) {
  Collector c;
  auto cfg = config_for(c.port());
  cfg.flush_interval = 5ms;
  cfg.queue = 256;
  auto e = std::make_unique<Exporter>(cfg, 2, resource());
  e->start();
  IdGenerator g(6);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(push(*e, i % 2, g));
  // The drain ends once the queues are empty: the deadline only bounds a broken one (tests at SCHED_IDLE
  // beside other jobs wait seconds for a core). A drain left running keeps its exporter, as server.cpp does:
  // destroyed under it, it is a use after free.
  if (!e->stop(std::chrono::steady_clock::now() + 60s)) {
    (void)e.release();
    FAIL() << "the drain did not end by its deadline";
  }
  EXPECT_EQ(e->stats().exported, 600u);
  EXPECT_EQ(e->stats().dropped_shutdown, 0u);
  std::size_t spans = 0;
  for (const auto& b : c.bodies()) spans += spans_in(b);
  EXPECT_EQ(spans, 600u);
}

}  // namespace
}  // namespace weir::tracing
