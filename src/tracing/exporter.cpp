#include "tracing/exporter.hpp"

#include <charconv>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/json/parse.hpp>

#include "core/process_metrics.hpp"

namespace weir::tracing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bh = beast::http;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kAnswerLimit = 64 * 1024;
constexpr auto kReportEvery = std::chrono::seconds(10);
// Retries of one batch (OTLP/HTTP §"Retryable Response Codes": 429, 502,
// 503, 504, and connection failures), with exponential backoff.
constexpr int kMaxAttempts = 3;
constexpr auto kFirstBackoff = std::chrono::milliseconds(500);
constexpr auto kMaxRetryAfter = std::chrono::seconds(5);

bool retryable(const PostResult& r) {
  return r.status == 0 || r.status == 429 || r.status == 502 || r.status == 503 || r.status == 504;
}

// partialSuccess.rejectedSpans of an ExportTraceServiceResponse (a JSON
// integer or, in proto3's JSON mapping of int64, a decimal string); 0 when absent.
std::uint64_t rejected_spans(std::string_view body, std::string& message) {
  boost::system::error_code ec;
  const auto v = boost::json::parse(body, ec);
  if (ec || !v.is_object()) return 0;
  const auto* ps = v.get_object().if_contains("partialSuccess");
  if (!ps || !ps->is_object()) return 0;
  if (const auto* m = ps->get_object().if_contains("errorMessage"); m && m->is_string())
    message = std::string(m->get_string()).substr(0, 200);
  const auto* r = ps->get_object().if_contains("rejectedSpans");
  if (!r) return 0;
  if (r->is_int64()) return r->get_int64() > 0 ? static_cast<std::uint64_t>(r->get_int64()) : 0;
  if (r->is_uint64()) return r->get_uint64();
  if (r->is_string()) {
    std::uint64_t n = 0;
    const auto s = r->get_string();
    std::from_chars(s.data(), s.data() + s.size(), n);
    return n;
  }
  return 0;
}

}  // namespace

// A small HTTP/1.1 client for one OTLP/HTTP endpoint: POSTs on one
// kept-alive connection (plain or TLS), each step bounded by a timeout,
// run to completion on the exporter's thread (its own io_context).
class OtlpClient {
 public:
  explicit OtlpClient(const TracingConfig& c) : c_(c) {
    if (c_.endpoint.tls) {
      tls_ctx_.emplace(asio::ssl::context::tls_client);
      tls_ctx_->set_options(asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
      boost::system::error_code ec;
      if (c_.ca_file.empty())
        tls_ctx_->set_default_verify_paths(ec);
      else
        tls_ctx_->load_verify_file(c_.ca_file, ec);
      tls_ctx_->set_verify_mode(asio::ssl::verify_peer);
    }
    req_.method(bh::verb::post);
    req_.target(c_.target);
    req_.version(11);
    req_.set(bh::field::host, c_.endpoint.host_header);
    req_.set(bh::field::content_type, "application/json");
    req_.set(bh::field::user_agent, fmt::format("weir/{}", core::build_version()));
    for (const auto& [k, v] : c_.headers) req_.set(k, v);
  }

  // POSTs `body` (taken, and given back when done) within `timeout`.
  PostResult post(std::string& body, std::chrono::milliseconds timeout) {
    req_.body() = std::move(body);
    req_.prepare_payload();
    PostResult out;
    // A kept-alive connection the collector closed in between fails before
    // any answer: once, on a fresh connection.
    for (int round = 0; round < 2; ++round) {
      const bool reused = connected();
      bool answered = false;
      asio::co_spawn(ioc_, exchange(timeout, answered), [&](std::exception_ptr e, PostResult r) {
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& ex) {
            r.error = ex.what();
          }
          close();
        }
        out = std::move(r);
      });
      ioc_.restart();
      ioc_.run();
      if (out.status != 0 || !reused || answered) break;
    }
    body = std::move(req_.body());
    return out;
  }

  void close() {
    boost::system::error_code ec;
    if (tls_) {
      beast::get_lowest_layer(*tls_).socket().shutdown(tcp::socket::shutdown_both, ec);
      tls_.reset();
    }
    if (plain_) {
      plain_->socket().shutdown(tcp::socket::shutdown_both, ec);
      plain_.reset();
    }
  }

 private:
  bool connected() const { return plain_ || tls_; }

  asio::awaitable<PostResult> exchange(std::chrono::milliseconds timeout, bool& answered) {
    PostResult r;
    if (!connected()) {
      if (auto err = co_await connect(timeout); !err.empty()) {
        r.error = std::move(err);
        close();
        co_return r;
      }
    }
    auto& lowest = tls_ ? beast::get_lowest_layer(*tls_) : *plain_;
    lowest.expires_after(timeout);
    bh::response_parser<bh::string_body> parser;
    parser.body_limit(kAnswerLimit);
    boost::system::error_code ec;
    if (tls_) {
      std::tie(ec, std::ignore) = co_await bh::async_write(*tls_, req_, kTuple);
      if (!ec) std::tie(ec, std::ignore) = co_await bh::async_read(*tls_, buf_, parser, kTuple);
    } else {
      std::tie(ec, std::ignore) = co_await bh::async_write(*plain_, req_, kTuple);
      if (!ec) std::tie(ec, std::ignore) = co_await bh::async_read(*plain_, buf_, parser, kTuple);
    }
    answered = parser.got_some();
    if (ec) {
      r.error = ec == beast::error::timeout ? "timed out" : ec.message();
      close();
      co_return r;
    }
    auto& res = parser.get();
    r.status = res.result_int();
    if (auto ra = res[bh::field::retry_after]; !ra.empty()) {
      std::int64_t s = 0;
      auto [p, e] = std::from_chars(ra.data(), ra.data() + ra.size(), s);
      if (e == std::errc() && p == ra.data() + ra.size() && s > 0)
        r.retry_after = std::min<std::chrono::milliseconds>(std::chrono::seconds(s), kMaxRetryAfter);
    }
    r.body = std::move(res.body());
    if (!res.keep_alive()) close();
    co_return r;
  }

  asio::awaitable<std::string> connect(std::chrono::milliseconds timeout) {
    auto ex = co_await asio::this_coro::executor;
    tcp::resolver resolver(ex);
    asio::steady_timer guard(ex);
    guard.expires_after(timeout);
    guard.async_wait([&](boost::system::error_code ec) {
      if (!ec) resolver.cancel();
    });
    auto [rec, endpoints] = co_await resolver.async_resolve(c_.endpoint.host, std::to_string(c_.endpoint.port), kTuple);
    guard.cancel();
    if (rec) co_return fmt::format("cannot resolve {}: {}", c_.endpoint.host, rec.message());
    buf_.clear();
    if (!tls_ctx_) {
      plain_.emplace(ex);
      plain_->expires_after(timeout);
      auto [cec, ep] = co_await plain_->async_connect(endpoints, kTuple);
      if (cec) co_return fmt::format("cannot connect: {}", cec == beast::error::timeout ? "timed out" : cec.message());
      plain_->socket().set_option(tcp::no_delay(true));
      co_return std::string();
    }
    tls_.emplace(ex, *tls_ctx_);
    if (!SSL_set_tlsext_host_name(tls_->native_handle(), c_.endpoint.host.c_str()))
      co_return std::string("cannot set the TLS server name");
    tls_->set_verify_callback(asio::ssl::host_name_verification(c_.endpoint.host));
    auto& lowest = beast::get_lowest_layer(*tls_);
    lowest.expires_after(timeout);
    auto [cec, ep] = co_await lowest.async_connect(endpoints, kTuple);
    if (cec) co_return fmt::format("cannot connect: {}", cec == beast::error::timeout ? "timed out" : cec.message());
    lowest.socket().set_option(tcp::no_delay(true));
    auto [hec] = co_await tls_->async_handshake(asio::ssl::stream_base::client, kTuple);
    if (hec) co_return fmt::format("TLS handshake failed: {}", hec.message());
    co_return std::string();
  }

  const TracingConfig& c_;
  asio::io_context ioc_{1};
  std::optional<asio::ssl::context> tls_ctx_;
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buf_{128 * 1024};  // bounded: the 8 KiB head limit, then one 64 KiB read
  bh::request<bh::string_body> req_;
};

Exporter::Exporter(TracingConfig config, unsigned workers, Resource resource)
    : config_(std::move(config)),
      sampler_(config_.sample_ratio),
      resource_json_(resource_json(resource)),
      client_(std::make_unique<OtlpClient>(config_)) {
  for (unsigned i = 0; i < workers; ++i) queues_.push_back(std::make_unique<TraceQueue>(config_.queue));
}

Exporter::~Exporter() {
  if (loop_.running()) stop(SteadyClock::now());
}

std::size_t Exporter::export_batch(SteadyClock::time_point deadline) {
  if (queues_.empty()) return 0;
  body_.clear();
  begin_export_request(body_, resource_json_, core::build_version());
  std::size_t taken = 0, spans = 0;
  // Takes traces from the queues in turn (one queue's backlog cannot starve the others);
  // each is encoded as it is taken, so its slot goes back to the worker at once.
  for (std::size_t visited = 0; visited < queues_.size() && taken < config_.batch; ++visited) {
    auto& q = *queues_[next_queue_];
    next_queue_ = (next_queue_ + 1) % queues_.size();
    while (taken < config_.batch) {
      const TraceRecord* r = q.front();
      if (!r) break;
      append_spans(body_, *r, taken == 0);
      spans += r->span_count();
      ++taken;
      q.pop();
    }
  }
  if (taken == 0) return 0;
  end_export_request(body_);
  auto backoff = std::chrono::milliseconds(kFirstBackoff);
  for (int attempt = 1;; ++attempt) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    const auto timeout = std::clamp(left, std::chrono::milliseconds(1), config_.timeout);
    PostResult r = client_->post(body_, timeout);
    if (r.status >= 200 && r.status < 300) {
      export_requests_.fetch_add(1, std::memory_order_relaxed);
      std::string message;
      const std::uint64_t rejected = std::min<std::uint64_t>(rejected_spans(r.body, message), spans);
      if (rejected) {
        dropped_rejected_.fetch_add(rejected, std::memory_order_relaxed);
        last_error_ =
            fmt::format("the collector rejected {} spans{}{}", rejected, message.empty() ? "" : ": ", message);
      }
      exported_.fetch_add(spans - rejected, std::memory_order_relaxed);
      return taken;
    }
    export_errors_.fetch_add(1, std::memory_order_relaxed);
    last_error_ = r.status ? fmt::format("{} answered {}", config_.endpoint.display, r.status)
                           : fmt::format("{}: {}", config_.endpoint.display, r.error);
    if (!retryable(r) || attempt == kMaxAttempts) break;
    const auto wait = r.retry_after.count() > 0 ? r.retry_after : backoff;
    if (SteadyClock::now() + wait >= deadline) break;
    if (loop_.sleep_for(wait) && SteadyClock::now() >= deadline) break;
    backoff *= 2;
  }
  dropped_export_.fetch_add(spans, std::memory_order_relaxed);
  return taken;
}

void Exporter::start() {
  last_report_ = SteadyClock::now();
  loop_.start(
      "weir-tracing", config_.priority, config_.batch, config_.flush_interval,
      [this] {
        const std::size_t n = export_batch(SteadyClock::now() + config_.timeout * kMaxAttempts);
        report();
        return n;
      },
      [this](SteadyClock::time_point deadline) { drain(deadline); });
}

void Exporter::stop(SteadyClock::time_point deadline) { loop_.stop(deadline); }

void Exporter::report(bool now_anyway) {
  const auto now = SteadyClock::now();
  std::uint64_t drops =
      dropped_export_.load(std::memory_order_relaxed) + dropped_rejected_.load(std::memory_order_relaxed);
  for (const auto& q : queues_) drops += q->dropped();
  const std::uint64_t errors = export_errors_.load(std::memory_order_relaxed);
  // The first trouble is said at once; then at most every 10 s.
  const bool first = reported_errors_ == 0 && reported_drops_ == 0 && (errors || drops);
  if (!now_anyway && !first && now - last_report_ < kReportEvery) return;
  if (drops != reported_drops_)
    fmt::print(stderr, "weir: tracing: {} spans dropped in the last {}s{}{}\n", drops - reported_drops_,
               std::chrono::duration_cast<std::chrono::seconds>(now - last_report_).count(),
               last_error_.empty() ? " (queue full)" : "; last error: ", last_error_);
  else if (errors != reported_errors_)
    fmt::print(stderr, "weir: tracing: {} failed exports (retried); last error: {}\n", errors - reported_errors_,
               last_error_);
  reported_drops_ = drops;
  reported_errors_ = errors;
  last_report_ = now;
}

void Exporter::drain(SteadyClock::time_point deadline) {
  // The workers have stopped, so the queues only shrink.
  while (SteadyClock::now() < deadline && export_batch(deadline) > 0) {
  }
  std::uint64_t left = 0;
  for (auto& q : queues_)
    while (const TraceRecord* r = q->front()) {
      left += r->span_count();
      q->pop();
    }
  dropped_shutdown_.fetch_add(left, std::memory_order_relaxed);
  if (left) fmt::print(stderr, "weir: tracing: {} spans not exported at shutdown (drain deadline)\n", left);
  report(true);
  client_->close();
}

ExporterStats Exporter::stats() const {
  ExporterStats s;
  s.exported = exported_.load(std::memory_order_relaxed);
  for (const auto& q : queues_) {
    s.dropped_queue_full += q->dropped();
    s.queued += q->size();
  }
  s.dropped_export = dropped_export_.load(std::memory_order_relaxed);
  s.dropped_rejected = dropped_rejected_.load(std::memory_order_relaxed);
  s.dropped_shutdown = dropped_shutdown_.load(std::memory_order_relaxed);
  s.export_requests = export_requests_.load(std::memory_order_relaxed);
  s.export_errors = export_errors_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace weir::tracing
