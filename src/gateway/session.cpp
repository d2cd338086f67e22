#include "gateway/session.hpp"

#include <array>
#include <charconv>

#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <fmt/format.h>

#include "admission/admission.hpp"
#include "admission/refill.hpp"
#include "api/json_scan.hpp"
#include "api/usage.hpp"
#include "auth/redis_keys.hpp"
#include "core/json_text.hpp"
#include "gateway/admin.hpp"
#include "gateway/worker.hpp"
#include "http/gzip.hpp"
#include "http/headers.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;
namespace asio = boost::asio;
using boost::system::error_code;
using http::use_task;

namespace {

// Per-connection buffers are most of a stream's memory (bench/results/memory.md):
// 10k open streams hold 10k of each. The monitor read waits for a close or
// the start of a pipelined request: 512 bytes do. A stream reads into its
// worker's buffers (Worker::stream_read_buffer) and holds none of its own.
constexpr std::size_t kMonitorRead = 512;
// A non-streaming body is read straight into resp_body_, this much room at a
// time (zero-filled by resize, so no more than one read can use: Beast reads
// at most max(512, free space of the connection's buffer) bytes).
constexpr std::size_t kBufferedRead = 4096;
constexpr std::string_view kLastChunk = "0\r\n\r\n";
// A reused upstream connection that fails this soon after the request went
// out was closed by the server before it could read it.
constexpr auto kStaleWindow = std::chrono::milliseconds(5);

// The path of a request target: origin-form "/p?q", or absolute-form
// "http://host/p?q", which a server must accept too (RFC 9112 §3.2.2).
std::string_view path_of(std::string_view target) {
  if (target.starts_with("http://") || target.starts_with("https://")) {
    const auto slash = target.find('/', target.find("://") + 3);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  auto q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

RouteKind classify_path(std::string_view path) {
  if (path == "/v1/chat/completions") return RouteKind::chat_completions;
  if (path == "/v1/completions") return RouteKind::completions;
  if (path == "/v1/embeddings") return RouteKind::embeddings;
  if (path == "/v1/models" || path.starts_with("/v1/models/")) return RouteKind::models;
  if (path == "/health") return RouteKind::health;
  if (path == "/ready") return RouteKind::ready;
  if (path == "/metrics") return RouteKind::metrics;
  return RouteKind::other;
}

bool valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (unsigned char c : id)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, p);
}

std::optional<FailureKind> failure_kind(http::UpstreamFailure f) {
  switch (f) {
    case http::UpstreamFailure::connect_refused: return FailureKind::connect_refused;
    case http::UpstreamFailure::connect_timeout: return FailureKind::connect_timeout;
    case http::UpstreamFailure::timeout: return FailureKind::timeout;
    case http::UpstreamFailure::reset: return FailureKind::reset;
    case http::UpstreamFailure::protocol: return FailureKind::protocol;
    default: return std::nullopt;
  }
}

// Who failed, for a client: the pool, the model asked for and the request id
// ("pool `llama` (model `llama-3`) ... (request 0123abcd...)"). Never the
// endpoint's address: that goes to the access log and metrics only, so a
// client does not learn the topology behind the gateway.
struct UpstreamSubject {
  std::string_view pool;
  std::string_view model;       // empty: none (quick mode's GET /v1/models)
  std::string_view request_id;
};

UpstreamSubject subject_of(const core::Config& cfg, const RequestContext& ctx) {
  return {cfg.pools[static_cast<std::size_t>(ctx.pool)].name, core::utf8_prefix(ctx.model, core::kMaxEchoBytes),
          ctx.request_id};
}

// "<lead> pool `P` (model `M`) <what> (request R)."
std::string upstream_message(const UpstreamSubject& who, std::string_view what, std::string_view lead = "Upstream") {
  std::string m = fmt::format("{} pool `{}`", lead, who.pool);
  if (!who.model.empty()) fmt::format_to(std::back_inserter(m), " (model `{}`)", who.model);
  fmt::format_to(std::back_inserter(m), " {} (request {}).", what, who.request_id);
  return m;
}

core::Error upstream_error(http::UpstreamFailure f, const UpstreamSubject& who, bool mid_stream) {
  const char* when = mid_stream ? " while streaming" : "";
  switch (f) {
    case http::UpstreamFailure::connect_refused:
      return core::upstream_unavailable(upstream_message(who, "refused the connection"));
    case http::UpstreamFailure::connect_timeout:
      return core::upstream_timeout(upstream_message(who, "timed out", "Connecting to upstream"));
    case http::UpstreamFailure::timeout:
      return core::upstream_timeout(upstream_message(who, fmt::format("timed out{}", when)));
    case http::UpstreamFailure::protocol:
      return core::upstream_unavailable(upstream_message(who, fmt::format("sent an invalid HTTP response{}", when)));
    default:
      return core::upstream_unavailable(upstream_message(who, fmt::format("closed the connection{}", when)));
  }
}

// An OpenAI/vLLM stream's final usage chunk: `"choices": []` plus usage.
bool is_usage_only_chunk(std::string_view data) {
  auto span = api::find_member(data, "choices");
  if (!span) return false;
  std::string_view v = data.substr(span->value_begin, span->value_end - span->value_begin);
  if (v.size() < 2 || v.front() != '[' || v.back() != ']') return false;
  for (char c : v.substr(1, v.size() - 2))
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return false;
  return true;
}

bool is_event_stream(std::string_view content_type) {
  return content_type.size() >= 17 && http::iequals(content_type.substr(0, 17), "text/event-stream");
}

}  // namespace

Session::Session(Worker& w, http::Socket sock)
    : w_(w),
      sock_(std::move(sock)),
      watchdog_(w.io().get_executor(),
                [this] {
                  timed_out_ = true;
                  error_code ignored;
                  sock_.cancel(ignored);
                }),
      read_done_(w.io().get_executor()),
      write_done_(w.io().get_executor()),
      sse_(4u << 20) {
  w_.add_session(this);
  ++w_.metrics().active_connections;
  error_code ignored;
  sock_.set_option(http::tcp::no_delay(true), ignored);
  sock_.non_blocking(true, ignored);  // start_write() tries a send before it waits
}

Session::~Session() {
  watchdog_.stop();
  --w_.metrics().active_connections;
  w_.remove_session(this);
}

http::Task<void> Session::run(std::unique_ptr<Session> self) {
  co_await self->serve();
  // Nothing may still reference the session: wait out the monitor read and
  // the write loop (closing the socket completes them).
  error_code ignored;
  self->sock_.close(ignored);
  while (self->reading_) co_await self->read_done_.wait();
  while (self->writing_) co_await self->write_done_.wait();
}

void Session::close_if_idle() {
  if (idle_ && !closed_) {
    closed_ = true;
    error_code ignored;
    sock_.cancel(ignored);
  }
}

void Session::force_close() {
  closed_ = true;
  error_code ignored;
  sock_.cancel(ignored);
  sock_.shutdown(http::tcp::socket::shutdown_both, ignored);
  if (upstream_) upstream_->abort(http::UpstreamFailure::cancelled);
}

// --- the connection loop -------------------------------------------------

http::Task<void> Session::serve() {
  const auto& sc = w_.config().server;
  bool first = true;
  for (;;) {
    if (reading_) {
      if (in_.size() > 0) {
        // The next request is already buffered (pipelined): the monitor read
        // would wait for bytes the client will not send before it gets its
        // answer. Stop it and serve what we have.
        monitor_cancelled_ = true;
        error_code ignored;
        sock_.cancel(ignored);
      } else {
        // The monitor read of the previous request is still waiting: it is the
        // start of this request (or the client's goodbye).
        idle_ = true;
        watchdog_.expires_after(sc.keepalive_timeout);
      }
      while (reading_) co_await read_done_.wait();
    }
    if (peer_gone_ || closed_ || timed_out_) co_return;
    if (w_.draining() && !first && in_.size() == 0) co_return;

    ctx_.reset();
    done_relayed_ = false;
    if (parser_) body_.swap(parser_->get().body());  // keep the body storage's capacity
    parser_.emplace();
    parser_->header_limit(sc.max_header_bytes);
    // No body limit while the head is read: Beast would reject a large
    // Content-Length as a header error; read_body() answers it with 413.
    parser_->body_limit(boost::none);
    body_.clear();
    idle_ = in_.size() == 0;
    watchdog_.expires_after(first ? sc.header_timeout : sc.keepalive_timeout);
    auto [ec, n] = co_await bh::async_read_header(sock_, in_, *parser_, use_task);
    idle_ = false;
    watchdog_.disarm();
    if (ec) {
      // A connection that closes or idles out between requests is not a request.
      if (ec == bh::error::end_of_stream || closed_ || (timed_out_ && n == 0 && in_.size() == 0) ||
          ec == asio::error::connection_reset || ec == asio::error::eof || ec == asio::error::bad_descriptor)
        co_return;
      ctx_.t_start = core::now();
      ctx_.method = "-";
      w_.next_request_id(ctx_.request_id);  // the head is unusable: never an empty id in the log or reply
      keep_alive_ = false;
      if (timed_out_) {
        timed_out_ = false;
        auto e = core::bad_request("The request head was not received in time.");
        e.status = 408;
        co_await respond_error(e);
      } else if (ec == bh::error::header_limit) {
        auto e = core::bad_request(fmt::format("The request head is larger than {} bytes.", sc.max_header_bytes));
        e.status = 431;
        co_await respond_error(e);
      } else {
        co_await respond_error(core::bad_request(fmt::format("Malformed HTTP request: {}.", ec.message())));
      }
      log_request();
      co_await lingering_close();
      co_return;
    }
    first = false;
    ctx_.t_start = core::now();
    keep_alive_ = parser_->get().keep_alive() && !w_.draining();
    const bool keep = co_await handle();
    log_request();
    if (!keep || !keep_alive_ || closed_) {
      if (!peer_gone_ && !closed_) co_await lingering_close();
      co_return;
    }
  }
}

http::Task<bool> Session::handle() {
  auto& req = parser_->get();
  const std::string_view target = req.target();
  const std::string_view path = path_of(target);
  ctx_.route = classify_path(path);
  ctx_.method.assign(req.method_string());
  ctx_.path.assign(core::utf8_prefix(path, core::kMaxEchoBytes));
  if (auto id = req["x-request-id"]; valid_request_id(id)) ctx_.request_id.assign(id);
  else w_.next_request_id(ctx_.request_id);
  ctx_.model_slot = w_.metrics().no_model();
  chunked_ = req.version() >= 11;

  const bool is_post_route = ctx_.route == RouteKind::chat_completions ||
                             ctx_.route == RouteKind::completions || ctx_.route == RouteKind::embeddings;
  const bool get_or_head = req.method() == bh::verb::get || req.method() == bh::verb::head;
  if (ctx_.route == RouteKind::other) {
    keep_alive_ = keep_alive_ && parser_->is_done();
    co_await respond_error(core::not_found(path));
    co_return keep_alive_;
  }
  if ((is_post_route && req.method() != bh::verb::post) || (!is_post_route && !get_or_head)) {
    keep_alive_ = keep_alive_ && parser_->is_done();
    auto e = core::method_not_allowed(req.method_string(), path);
    head_.clear();
    co_await respond(405, "application/json", core::error_json(e),
                     is_post_route ? "Allow: POST\r\n" : "Allow: GET, HEAD\r\n");
    ctx_.set_error(e);
    co_return keep_alive_;
  }
  if (!parser_->is_done() && !co_await read_body()) co_return false;

  switch (ctx_.route) {
    case RouteKind::chat_completions: co_await proxy(api::ApiKind::chat_completions); break;
    case RouteKind::completions: co_await proxy(api::ApiKind::completions); break;
    case RouteKind::embeddings: co_await proxy(api::ApiKind::embeddings); break;
    case RouteKind::models: {
      if (w_.config().models.empty() && w_.config().default_pool) {
        co_await proxy(std::nullopt);  // quick mode: the upstream knows its models
        break;
      }
      if (auto e = co_await authenticate()) {
        co_await respond_error(*e);
        break;
      }
      auto r = models_response(w_.config(), path, principal_.get());
      if (!r) {
        co_await respond_error(r.error());
      } else {
        co_await respond(200, "application/json", *r);
      }
      break;
    }
    case RouteKind::health: co_await respond(200, "application/json", R"({"status":"ok"})"); break;
    case RouteKind::ready:
      if (w_.draining()) co_await respond_error(core::unavailable("Weir is draining."));
      else co_await respond(200, "application/json", R"({"status":"ready"})");
      break;
    case RouteKind::metrics: co_await serve_metrics(); break;
    default: break;
  }
  co_return !peer_gone_ && !write_failed_;
}

http::Task<bool> Session::read_body() {
  const auto& sc = w_.config().server;
  auto& req = parser_->get();
  parser_->body_limit(sc.max_body_bytes);  // chunked bodies are cut here too
  if (auto cl = parser_->content_length(); cl && *cl > sc.max_body_bytes) {
    // Refuse before reading: the client may not even send the body (Expect).
    keep_alive_ = false;
    co_await respond_error(core::payload_too_large(sc.max_body_bytes));
    co_return false;
  }
  if (http::iequals(req[bh::field::expect], "100-continue")) {
    static constexpr std::string_view k100 = "HTTP/1.1 100 Continue\r\n\r\n";
    watchdog_.expires_after(sc.write_timeout);
    auto [ec, n] = co_await asio::async_write(sock_, asio::buffer(k100), use_task);
    watchdog_.disarm();
    if (ec) {
      peer_gone_ = true;
      ctx_.status = 499;
      co_return false;
    }
  }
  // Reuse the connection's (or a spare) body storage: string_body reserves Content-Length.
  if (body_.capacity() == std::string().capacity()) body_ = w_.take_buffer();
  req.body().swap(body_);
  req.body().clear();
  // A small body usually arrived with the head: parse it from in_ now
  // (the socket is non-blocking: a missing part answers would_block, and
  // the read goes on asynchronously).
  error_code ec;
  if (in_.size() > 0) bh::read(sock_, in_, *parser_, ec);
  if (in_.size() == 0 || ec == asio::error::would_block || ec == asio::error::try_again) {
    watchdog_.expires_after(sc.body_timeout);
    auto [rec, n] = co_await bh::async_read(sock_, in_, *parser_, use_task);
    watchdog_.disarm();
    ec = rec;
  }
  if (!ec) co_return true;
  keep_alive_ = false;
  if (ec == bh::error::body_limit) {
    co_await respond_error(core::payload_too_large(sc.max_body_bytes));
  } else if (timed_out_) {
    timed_out_ = false;
    auto e = core::bad_request("The request body was not received in time.");
    e.status = 408;
    co_await respond_error(e);
  } else if (ec == bh::error::partial_message || ec == bh::error::end_of_stream ||
             ec == asio::error::connection_reset || ec == asio::error::eof) {
    peer_gone_ = true;
    ctx_.status = 499;
    ctx_.set_error(core::bad_request("The client closed the connection before sending the whole body."));
    ctx_.error_source = core::ErrorSource::client;
    ctx_.error_code = "client_closed_request";
  } else {
    co_await respond_error(core::bad_request(fmt::format("Malformed request body: {}.", ec.message())));
  }
  co_return false;
}

// --- proxying ------------------------------------------------------------

http::Task<void> Session::proxy(std::optional<api::ApiKind> api) {
  auto& req = parser_->get();
  auto& metrics = w_.metrics();
  std::string_view up_body = req.body();
  ctx_.bytes_in = up_body.size();
  metrics.bytes_in += up_body.size();

  // authenticate (before anything is parsed)
  if (auto e = co_await authenticate()) {
    co_await respond_error(*e);
    co_return;
  }

  // parse + route
  routing::Route route;
  if (api) {
    auto fields = api::parse_request(*api, up_body);
    if (!fields) {
      co_await respond_error(fields.error());
      co_return;
    }
    ctx_.model = std::move(fields->model);
    ctx_.stream = fields->stream;
    auto r = w_.routes().find(ctx_.model);
    if (!r) {
      co_await respond_error(core::model_not_found(ctx_.model));
      co_return;
    }
    route = *r;
    ctx_.model_slot = route.model_index == routing::kUnlistedModel ? metrics.unlisted_model() : route.model_index;

    // admit: model allow-list, rate limits, stream caps, budgets
    if (auto e = co_await admit(*api, *fields,
                                route.canonical.empty() ? std::string_view(ctx_.model) : route.canonical,
                                route.default_max_tokens)) {
      co_await respond_error(*e);
      co_return;
    }

    // The upstream request body: the client's bytes, with at most two members spliced.
    if (!route.upstream_model.empty() && route.upstream_model != ctx_.model) {
      scratch_.clear();
      core::append_json_string(scratch_, route.upstream_model);
      if (upstream_body_.capacity() == std::string().capacity()) upstream_body_ = w_.take_buffer();
      if (api::set_member(up_body, "model", scratch_, upstream_body_)) up_body = upstream_body_;
    }
    if (ctx_.stream && !fields->include_usage && *api != api::ApiKind::embeddings &&
        w_.config().pools[route.pool].request_usage) {
      // Ask for the usage chunk so this stream's tokens are known; the client
      // did not ask for it, so relay_stream drops it from the client's stream.
      bool edited = false;
      if (edit_buf_.capacity() == std::string().capacity()) edit_buf_ = w_.take_buffer();
      if (fields->has_stream_options) {
        auto span = api::find_member(up_body, "stream_options");
        std::string_view obj;
        if (span) obj = up_body.substr(span->value_begin, span->value_end - span->value_begin);
        // vLLM's StreamOptions.include_usage defaults to true: without the
        // member the upstream sends the usage chunk and the client gets it.
        if (span && api::find_member(obj, "include_usage")) {
          // vLLM ignores continuous_usage_stats unless include_usage is true:
          // once Weir turns usage on, keep per-chunk usage off, as the client had it.
          std::string no_continuous;
          if (api::find_member(obj, "continuous_usage_stats") &&
              api::set_member(obj, "continuous_usage_stats", "false", no_continuous))
            obj = no_continuous;
          edited = api::set_member(obj, "include_usage", "true", scratch_) &&
                   api::set_member(up_body, "stream_options", scratch_, edit_buf_);
        }
      } else {
        edited = api::set_member(up_body, "stream_options", R"({"include_usage":true})", edit_buf_);
      }
      if (edited) {
        up_body = edit_buf_;
        strip_usage_ = true;
      }
    }
  } else {
    route.pool = static_cast<std::uint32_t>(*w_.config().default_pool);
    // GET/HEAD (the upstream's model list): a request body means nothing
    // there, and forwarded without a length the upstream would read it as
    // the next request on the connection (request smuggling).
    up_body = {};
  }

  auto& pool = w_.pool(route.pool);
  const auto& timeouts = pool.config().timeouts;
  ctx_.pool = static_cast<int>(route.pool);

  // The client may leave while we wait on the upstream: watch for it.
  start_monitor();

  std::optional<ResponseParser> rp;
  std::unique_ptr<http::UpstreamConnection> conn;
  auto now = core::now();
  std::uint32_t ep_idx = pool.pick(now, w_.rng());
  std::uint32_t connect_attempts = 0;
  bool fresh_retry_used = false;
  bool force_fresh = false;
  std::int64_t added = core::micros_between(ctx_.t_start, now);  // parse + route
  http::UpstreamFailure failure = http::UpstreamFailure::none;

  for (;;) {
    auto& ep = pool.endpoint(ep_idx);
    ctx_.endpoint = static_cast<int>(ep_idx);
    conn = force_fresh ? nullptr : ep.conns.take(core::now());
    const bool reused = conn != nullptr;
    if (!conn) {
      conn = std::make_unique<http::UpstreamConnection>(w_.io().get_executor());
      upstream_ = conn.get();
      ++metrics.upstream_connects;
      ++connect_attempts;
      failure = co_await http::connect(*conn, ep.addr, timeouts.connect);
      upstream_ = nullptr;
      if (peer_gone_) break;
      if (failure != http::UpstreamFailure::none) {
        if (auto k = failure_kind(failure)) ++metrics.upstream_failures[static_cast<std::size_t>(*k)];
        pool.report_connect_failure(ep_idx, core::now());
        if (connect_attempts < pool.size()) {
          // Another endpoint may take it: nothing has been sent anywhere.
          ++ctx_.retries;
          ++metrics.upstream_retries;
          ep_idx = pool.pick(core::now(), w_.rng(), ep_idx);
          continue;
        }
        break;
      }
      pool.report_success(ep_idx);
    }
    upstream_ = conn.get();
    ++ep.in_flight;
    const auto t0 = core::now();
    head_.clear();
    append_upstream_head(head_, ep.cfg->host_header, up_body, pool.config().api_key, ctx_.stream);
    conn->watchdog().expires_after(timeouts.first_byte);
    const std::array<asio::const_buffer, 2> bufs{asio::buffer(head_), asio::buffer(up_body.data(), up_body.size())};
    ctx_.t_upstream_sent = core::now();
    added += core::micros_between(t0, ctx_.t_upstream_sent);
    auto [wec, wn] = co_await http::write_all_now(conn->socket(), bufs);
    error_code ec = wec;
    std::size_t got = 0;
    if (!ec) {
      rp.emplace();
      rp->header_limit(64u << 10);
      rp->body_limit(boost::none);
      if (req.method() == bh::verb::head) rp->skip(true);
      auto [rec, rn] = co_await bh::async_read_header(conn->socket(), conn->buffer(), *rp, use_task);
      ec = rec;
      got = rn;
    }
    if (!ec) break;
    --ep.in_flight;
    upstream_ = nullptr;
    failure = http::classify(*conn, ec);
    if (peer_gone_) break;
    if (reused && !fresh_retry_used && failure == http::UpstreamFailure::reset && got == 0 &&
        core::now() - ctx_.t_upstream_sent < kStaleWindow) {
      // The pooled connection failed at once, before any answer: the server
      // had closed it (the pool's peek missed it by a hair). Retry once on a
      // fresh connection. A later failure may be an upstream that started the
      // generation, so that one is answered with 502, never run twice.
      fresh_retry_used = true;
      force_fresh = true;
      ++ctx_.retries;
      ++metrics.upstream_retries;
      continue;
    }
    if (auto k = failure_kind(failure)) ++metrics.upstream_failures[static_cast<std::size_t>(*k)];
    break;
  }

  if (peer_gone_) {
    ctx_.status = 499;
    ++metrics.client_disconnects;
    if (upstream_) --pool.endpoint(ep_idx).in_flight;
    upstream_ = nullptr;
    co_return;
  }
  if (!upstream_) {
    auto e = upstream_error(failure, subject_of(w_.config(), ctx_), false);
    ctx_.added_us = added;
    co_await respond_error(e);
    co_return;
  }

  ctx_.t_first_byte = core::now();
  ctx_.upstream_status = rp->get().result_int();
  ctx_.added_us = added;
  const auto ct = rp->get()[bh::field::content_type];
  // Streams are asked for in identity; events cannot be read out of compressed
  // bytes, so a stream compressed anyway is relayed whole, as a buffered body
  // (decoded for a client that did not accept the encoding).
  const auto ce = rp->get()[bh::field::content_encoding];
  const bool encoded = !ce.empty() && !http::iequals(ce, "identity");
  // The request went out and cannot be retried any more: its storage goes
  // back to the worker, so a long stream does not hold it.
  w_.give_buffer(parser_->get().body());
  w_.give_buffer(upstream_body_);
  w_.give_buffer(edit_buf_);
  if (rp->get().result_int() == 200 && is_event_stream(ct) && !rp->is_done() && !encoded) {
    co_await relay_stream(*rp, *conn);
  } else {
    co_await relay_buffered(*rp, *conn);
  }
  --pool.endpoint(ep_idx).in_flight;
  upstream_ = nullptr;
  // Keep the connection only after a complete, keep-alive response.
  if (rp->is_done() && rp->keep_alive() && conn->is_open() && conn->aborted_for() == http::UpstreamFailure::none) {
    ++conn->uses;
    pool.endpoint(ep_idx).conns.put(std::move(conn), core::now());
  }
}

void Session::append_upstream_head(std::string& out, std::string_view host_header, std::string_view body,
                                   std::string_view api_key, bool stream) {
  const auto& req = parser_->get();
  out += req.method_string();
  out += ' ';
  out += req.target();
  out += " HTTP/1.1\r\nHost: ";
  out += host_header;
  out += "\r\n";
  // Every body sent upstream has its length: bytes without one would be
  // parsed as the next request on the (pooled) connection.
  if (!body.empty() || (req.method() != bh::verb::get && req.method() != bh::verb::head)) {
    out += "Content-Length: ";
    append_uint(out, body.size());
    out += "\r\n";
  }
  http::append_header(out, "x-request-id", ctx_.request_id);
  if (!api_key.empty()) {
    out += "Authorization: Bearer ";
    out += api_key;
    out += "\r\n";
  }
  // Streams are parsed event by event: ask for them uncompressed.
  if (stream) out += "Accept-Encoding: identity\r\n";
  // The client's credential is for Weir when Weir authenticates, or replaced
  // by the pool's key: either way it never reaches the model server.
  const bool strip_credentials = !api_key.empty() || w_.authenticator() != nullptr;
  const std::string_view connection = req[bh::field::connection];
  for (const auto& f : req) {
    const auto name = f.name_string();
    switch (f.name()) {
      case bh::field::host:
      case bh::field::content_length:
      case bh::field::expect:
        continue;
      case bh::field::accept_encoding:
        if (stream) continue;
        break;
      case bh::field::authorization:
        if (strip_credentials) continue;
        break;
      default:
        break;
    }
    if (http::is_hop_by_hop(name, connection) || http::iequals(name, "x-request-id")) continue;
    if (strip_credentials && http::iequals(name, "x-api-key")) continue;
    out += name;
    out += ": ";
    out += f.value();
    out += "\r\n";
  }
  out += "\r\n";
}

void Session::append_response_headers(std::string& out, const ResponseParser& rp, bool drop_encoding) {
  const auto& res = rp.get();
  const std::string_view connection = res[bh::field::connection];
  for (const auto& f : res) {
    switch (f.name()) {
      case bh::field::content_length:
        continue;
      case bh::field::content_encoding:
        if (drop_encoding) continue;
        break;
      default:
        break;
    }
    if (http::is_hop_by_hop(f.name_string(), connection) || http::iequals(f.name_string(), "x-request-id")) continue;
    out += f.name_string();
    out += ": ";
    out += f.value();
    out += "\r\n";
  }
  http::append_header(out, "x-request-id", ctx_.request_id);
  out += rl_headers_;
  append_connection_header(out);
}

http::Task<void> Session::relay_buffered(ResponseParser& rp, http::UpstreamConnection& conn) {
  const auto& sc = w_.config().server;
  const auto& timeouts = w_.pool(static_cast<std::uint32_t>(ctx_.pool)).config().timeouts;
  resp_body_.clear();
  http::UpstreamFailure failure = http::UpstreamFailure::none;
  while (!rp.is_done()) {
    const std::size_t have = resp_body_.size();
    resp_body_.resize(have + kBufferedRead);
    rp.get().body().data = resp_body_.data() + have;
    rp.get().body().size = kBufferedRead;
    conn.watchdog().expires_after(timeouts.idle);
    auto [ec, n] = co_await bh::async_read_some(conn.socket(), conn.buffer(), rp, use_task);
    resp_body_.resize(have + kBufferedRead - rp.get().body().size);
    if (ec == bh::error::need_buffer) ec = {};
    if (ec) {
      failure = http::classify(conn, ec);
      break;
    }
    if (resp_body_.size() > sc.max_response_bytes) {
      failure = http::UpstreamFailure::protocol;
      break;
    }
  }
  conn.watchdog().disarm();
  ctx_.t_upstream_done = core::now();
  // The upstream response is complete: a client leaving while we write it
  // must not abort the connection, which goes back to the pool.
  if (rp.is_done()) upstream_ = nullptr;
  if (peer_gone_) {
    ctx_.status = 499;
    ++w_.metrics().client_disconnects;
    co_return;
  }
  if (failure != http::UpstreamFailure::none) {
    if (auto k = failure_kind(failure)) ++w_.metrics().upstream_failures[static_cast<std::size_t>(*k)];
    const auto who = subject_of(w_.config(), ctx_);
    auto e = resp_body_.size() > sc.max_response_bytes
                 ? core::upstream_unavailable(upstream_message(
                       who, fmt::format("sent a response larger than {} bytes", sc.max_response_bytes)))
                 : upstream_error(failure, who, false);
    co_await respond_error(e);
    co_return;
  }
  const auto t0 = core::now();
  const int status = rp.get().result_int();
  const auto& req = parser_->get();
  std::string_view body = resp_body_;

  // Content-Encoding: the body's bytes must always match its headers, and a
  // client never gets an encoding it did not accept. Pass gzip through to a
  // client that accepts it; decode it for one that does not.
  const std::string_view encoding = rp.get()[bh::field::content_encoding];
  const bool encoded = !encoding.empty() && !http::iequals(encoding, "identity");
  const bool accepted = encoded && http::has_token(req[bh::field::accept_encoding], encoding);
  std::string_view plain = body;  // the decoded body, for reading usage
  bool drop_encoding = false;
  if (encoded && body.empty()) {
    // Nothing to decode (Content-Length 0, or HEAD): drop a label the client did not ask for.
    drop_encoding = !accepted;
  } else if (encoded) {
    const bool gzip = http::iequals(encoding, "gzip") || http::iequals(encoding, "x-gzip") ||
                      http::iequals(encoding, "deflate");
    if (gzip && http::gunzip(body, scratch_, sc.max_response_bytes)) {
      plain = scratch_;
      if (!accepted) {
        body = scratch_;
        drop_encoding = true;
      }
    } else {
      plain = {};
      if (!accepted) {
        ++w_.metrics().upstream_failures[static_cast<std::size_t>(FailureKind::protocol)];
        co_await respond_error(core::upstream_unavailable(upstream_message(
            subject_of(w_.config(), ctx_),
            fmt::format("sent a body in Content-Encoding '{}' that Weir cannot decode for this client",
                        core::utf8_prefix(encoding, 64)))));
        co_return;
      }
    }
  }
  if (status >= 200 && status < 300 && !plain.empty()) {
    if (auto u = api::extract_usage(plain)) {
      ctx_.has_usage = true;
      ctx_.usage = *u;
    }
  }
  ctx_.status = status;
  if (status >= 400) {
    ctx_.has_error = true;
    ctx_.error_source = status >= 500 ? core::ErrorSource::upstream : core::ErrorSource::client;
    ctx_.error_code = "upstream_status";
  }
  head_.clear();
  http::append_status_line(head_, status);
  append_response_headers(head_, rp, drop_encoding);
  if (drop_encoding) head_ += "Vary: Accept-Encoding\r\n";
  const bool no_body = req.method() == bh::verb::head || status == 204 || status == 304;
  if (!no_body) {
    head_ += "Content-Length: ";
    append_uint(head_, body.size());
    head_ += "\r\n";
  }
  head_ += "\r\n";
  ctx_.added_us += core::micros_between(t0, core::now());
  co_await write_all(head_, no_body ? std::string_view{} : body);
  if (resp_body_.capacity() > (1u << 20)) std::string().swap(resp_body_);
  if (scratch_.capacity() > (1u << 20)) std::string().swap(scratch_);
}

http::Task<void> Session::relay_stream(ResponseParser& rp, http::UpstreamConnection& conn) {
  const auto& sc = w_.config().server;
  const auto& timeouts = w_.pool(static_cast<std::uint32_t>(ctx_.pool)).config().timeouts;
  auto& metrics = w_.metrics();
  ++metrics.active_streams;
  ctx_.status = 200;
  if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends at close

  // Response head now: the client sees its stream open before the first token.
  const auto t0 = core::now();
  out_.clear();
  http::append_status_line(out_, 200);
  append_response_headers(out_, rp, false);
  if (chunked_) out_ += "Transfer-Encoding: chunked\r\n";
  out_ += "\r\n";
  start_write();
  ctx_.added_us += core::micros_between(t0, core::now());

  sse_.reset();
  http::UpstreamFailure failure = http::UpstreamFailure::none;
  bool first_read = true;
  bool cut_off = false;
  done_relayed_ = false;

  // Every SSE event completed by `bytes` (body bytes, in order) is appended
  // to scratch_; false on an SSE framing error.
  auto take_events = [&](std::string_view bytes, core::TimePoint t_read) {
    sse_.push(bytes);
    while (auto ev = sse_.next()) {
      if (ev->has_data) {
        if (ev->is_done()) {
          done_relayed_ = true;
        } else if (ev->data.find("\"usage\"") != std::string_view::npos) {
          if (auto u = api::extract_usage(ev->data)) {
            ctx_.has_usage = true;
            ctx_.usage = *u;
            // The usage chunk Weir asked for on the client's behalf: not theirs.
            if (strip_usage_ && is_usage_only_chunk(ev->data)) continue;
          }
        }
        ++ctx_.events;
        if (ctx_.t_first_token == core::TimePoint{}) ctx_.t_first_token = t_read;
      }
      scratch_ += ev->raw;
    }
    return !sse_.error();
  };

  // The read loop, written for the steady state of a long stream: per
  // upstream read one readiness wait (Asio re-arms the descriptor with one
  // epoll_ctl), one recv and one send, and no completion queued through the
  // scheduler (async_read_some would try a recv that finds the socket empty
  // after every read: Asio 1.26 marks a socket drained only at EOF). A recv lands in the
  // worker's read buffer and is parsed at once (Beast's parser takes the
  // chunk framing off into the worker's body buffer; events go to scratch_),
  // so an open stream holds no read buffer of its own: only the bytes of a
  // chunk header split across reads wait in the connection's buffer. Every
  // event completed by one read leaves in one write.
  auto& sock = conn.socket();
  auto& raw = conn.buffer();
  const auto rd = w_.stream_read_buffer();
  const auto body = w_.stream_body_buffer();
  error_code ec;  // the socket is non-blocking since connect (http::connect)
  rp.eager(true);
  bool need_read = raw.size() == 0;  // else first parse what the head's read left over
  bool drained = false;              // the last recv emptied the socket: wait for readiness first
  unsigned full_reads = 0;           // recvs in a row that filled the buffer (a fast upstream)
  while (!rp.is_done()) {
    std::string_view in;
    if (need_read) {
      conn.watchdog().expires_after(timeouts.idle);
      if (drained) {
        auto [wec] = co_await sock.async_wait(http::tcp::socket::wait_read, use_task);
        if (wec) {
          ec = wec;
          break;
        }
      }
      // Bytes left by the last read (a chunk header split across reads, a
      // few bytes) go first, and the recv lands right after them.
      const std::size_t carried = raw.size();
      if (carried + 512 > rd.size()) {  // no chunk header is that long
        failure = http::UpstreamFailure::protocol;
        break;
      }
      const std::size_t n = sock.read_some(rd + carried, ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        ec = {};
        drained = true;
        continue;
      }
      if (ec == asio::error::eof) {
        // A body that ends at close (no length, not chunked) is complete now.
        ec = {};
        if (rp.got_some()) rp.put_eof(ec);
        if (!ec && !rp.is_done()) ec = bh::error::partial_message;
        break;
      }
      if (ec) break;
      // After 8 full recvs in a row (128 KiB) wait anyway: the socket is
      // still readable, so the wait completes at once, after the worker's
      // other streams had their turn.
      full_reads = n < rd.size() - carried ? 0 : full_reads + 1;
      drained = full_reads == 0 || full_reads >= 8;
      if (full_reads >= 8) full_reads = 0;
      asio::buffer_copy(rd, raw.data());
      raw.consume(carried);
      in = std::string_view(static_cast<const char*>(rd.data()), carried + n);
    }
    need_read = true;
    const bool from_raw = in.data() == nullptr;
    if (from_raw) in = std::string_view(static_cast<const char*>(raw.data().data()), raw.size());
    const auto t_read = core::now();
    scratch_.clear();
    // Parse all that was read: chunk framing off, body bytes into `body`.
    std::size_t off = 0;
    while (off < in.size() && !rp.is_done()) {
      rp.get().body().data = body.data();
      rp.get().body().size = body.size();
      error_code pec;
      const std::size_t used = rp.put(asio::buffer(in.data() + off, in.size() - off), pec);
      off += used;
      const std::size_t got = body.size() - rp.get().body().size;
      if (got > 0 && !take_events(std::string_view(static_cast<const char*>(body.data()), got), t_read)) {
        failure = http::UpstreamFailure::protocol;
        break;
      }
      if (pec == bh::error::need_more) break;  // a partial chunk header: read on
      if (pec && pec != bh::error::need_buffer) {
        failure = http::UpstreamFailure::protocol;
        break;
      }
      if (used == 0 && got == 0 && !pec) break;
    }
    rp.get().body().data = nullptr;  // the worker's buffer is not this stream's
    if (from_raw) {
      raw.consume(off);
    } else if (off < in.size() && !rp.is_done()) {
      const std::size_t left = in.size() - off;  // keep the split chunk header for the next read
      asio::buffer_copy(raw.prepare(left), asio::buffer(in.data() + off, left));
      raw.commit(left);
    }
    // Bytes of earlier reads the client has not taken yet: the slow-client
    // measure. Not this read's events: one event larger than the bound (a
    // chunk with prompt_logprobs) is not a slow client.
    const std::size_t backlog = out_.size() + wbuf_.size();
    if (!scratch_.empty()) {
      queue_body(scratch_);
      if (!writing_) start_write();
      if (first_read) {
        ctx_.added_us += core::micros_between(t_read, core::now());
        first_read = false;
      }
    }
    if (failure != http::UpstreamFailure::none) break;
    if (backlog > sc.max_stream_buffer_bytes) {
      // The client is not keeping up: cut it off rather than buffer without bound.
      cut_off = true;
      break;
    }
    // The monitor saw the client leave (and closed the upstream), unless the
    // stream was over for it: then read the upstream's last bytes, so its
    // connection goes back to the pool.
    if (peer_gone_ && !done_relayed_) break;
  }
  if (cut_off) {
    ++metrics.slow_client_cutoffs;
    ctx_.status = 499;
    ctx_.has_error = true;
    ctx_.error_source = core::ErrorSource::client;
    ctx_.error_code = "slow_client";
    peer_gone_ = true;
    conn.abort(http::UpstreamFailure::cancelled);
  } else if (failure == http::UpstreamFailure::none && ec) {
    failure = http::classify(conn, ec);
  }
  conn.watchdog().disarm();
  ctx_.t_upstream_done = core::now();
  --metrics.active_streams;
  // As in relay_buffered: once the upstream response is complete, a client
  // that leaves (the openai SDK closes as soon as it reads [DONE]) must not
  // abort the finished upstream connection, which goes back to the pool.
  if (rp.is_done()) upstream_ = nullptr;

  // The client read [DONE] and left before the upstream's last bytes (the
  // openai SDK closes as soon as it reads [DONE]): a complete stream.
  const bool finished = done_relayed_ && !write_failed_ && !writing_ && out_.empty();
  if (peer_gone_ && finished) {
    keep_alive_ = false;
    if (!rp.is_done()) conn.abort(http::UpstreamFailure::cancelled);
    error_code ignored;
    sock_.close(ignored);
    sse_.reset();
    co_return;
  }
  if (peer_gone_ || write_failed_) {
    if (ctx_.error_code != "slow_client") {
      ctx_.status = 499;
      ++metrics.client_disconnects;
      if (timed_out_) {
        ++metrics.slow_client_cutoffs;
        ctx_.has_error = true;
        ctx_.error_source = core::ErrorSource::client;
        ctx_.error_code = "client_write_timeout";
      }
    }
    if (!rp.is_done()) conn.abort(http::UpstreamFailure::cancelled);
    keep_alive_ = false;
    error_code ignored;
    sock_.close(ignored);
    co_return;
  }
  if (failure != http::UpstreamFailure::none && failure != http::UpstreamFailure::cancelled) {
    // Headers are out: the error goes in-band, as vLLM does, then [DONE].
    if (auto k = failure_kind(failure)) ++metrics.upstream_failures[static_cast<std::size_t>(*k)];
    const auto e = upstream_error(failure, subject_of(w_.config(), ctx_), true);
    ctx_.set_error(e);
    scratch_.clear();
    std::string err;
    core::append_error_json(err, e);
    http::append_sse_data(scratch_, err);
    if (!done_relayed_) http::append_sse_data(scratch_, "[DONE]");
    queue_body(scratch_);
    conn.abort(http::UpstreamFailure::cancelled);
  }
  if (chunked_) out_ += kLastChunk;
  if (!writing_) start_write();
  co_await drain_writes();
  if (write_failed_) {
    ctx_.status = 499;
    ++metrics.client_disconnects;
    keep_alive_ = false;
  }
  sse_.reset();
}

void Session::append_connection_header(std::string& out) const {
  if (!keep_alive_) out += "Connection: close\r\n";
  else if (parser_ && parser_->is_header_done() && parser_->get().version() < 11) out += "Connection: keep-alive\r\n";
}

// --- identity and admission -------------------------------------------------

http::Task<std::optional<core::Error>> Session::authenticate() {
  auto* authn = w_.authenticator();
  if (!authn) co_return std::nullopt;
  const auto& req = parser_->get();
  auto p = authn->authenticate(req[bh::field::authorization], req["x-api-key"], std::chrono::system_clock::now());
  if (!p && authn->refetch_mark()) {
    // The token names a key we do not hold yet (a rotation): wait for the
    // refetch it started, at most 2 s, and try once more.
    const auto mark = *authn->refetch_mark();
    const auto deadline = core::now() + std::chrono::seconds(2);
    http::Timer t(w_.io().get_executor());
    while (authn->jwks()->completed_fetches() <= mark && core::now() < deadline) {
      t.expires_after(std::chrono::milliseconds(5));
      co_await t.async_wait(use_task);
    }
    p = authn->authenticate(req[bh::field::authorization], req["x-api-key"], std::chrono::system_clock::now());
  } else if (!p && authn->key_lookup_pending()) {
    // An API key this worker has not seen: one lookup in Redis (bounded by
    // redis.command_timeout), whose answer the worker caches; then the
    // second authenticate() is final (found, refused, or 503 unavailable).
    co_await auth::async_key_lookup(*authn, w_.io().get_executor(), use_task);
    p = authn->authenticate(req[bh::field::authorization], req["x-api-key"], std::chrono::system_clock::now());
  }
  if (!p) co_return std::move(p.error());
  principal_ = std::move(*p);
  co_return std::nullopt;
}

http::Task<std::optional<core::Error>> Session::admit(api::ApiKind api, const api::RequestFields& fields,
                                                      std::string_view model, std::uint32_t default_max_tokens) {
  prompt_tokens_ = (fields.prompt_bytes + 3) / 4 + fields.prompt_overhead_tokens;
  if (!principal_) co_return std::nullopt;
  price_ = w_.shared().pricing.find(model);
  if (auto ok = auth::Authenticator::check_model(*principal_, model); !ok) co_return std::move(ok.error());
  // Completion budget when the request gives no max_tokens: vLLM's own
  // default depends on the context length, so take the route's default
  // (models.X.default_max_tokens) and let settle() correct it with the real usage.
  const std::uint64_t out_tokens =
      api == api::ApiKind::embeddings
          ? 0
          : std::uint64_t{fields.max_tokens ? fields.max_tokens : default_max_tokens} * fields.n * fields.prompt_count;
  auto* adm = w_.admission();
  const auto estimate = admission::TokenEstimate::of(fields.prompt_bytes, out_tokens, fields.prompt_overhead_tokens);
  auto now = std::chrono::steady_clock::now();
  admission::Shortfall wait;
  auto t = adm->admit(*principal_, model, estimate, now, &wait);
  if (!t && wait.pending) {
    // A shared (Redis) limit: this replica's lease is short but the shared
    // bucket may cover it. Wait once for a refill; the second answer is final.
    co_await admission::async_refill(*w_.shared().limiter, wait, w_.index(), w_.io().get_executor(), use_task);
    now = std::chrono::steady_clock::now();
    t = adm->admit(*principal_, model, estimate, now);
  }
  // OpenAI's x-ratelimit-* headers go on every answer to this request, a 429 included.
  const auto h = adm->rate_limit_headers(*principal_, now);
  rl_headers_.clear();
  auto put = [&](std::string_view kind, const admission::BucketView& b) {
    fmt::format_to(std::back_inserter(rl_headers_),
                   "x-ratelimit-limit-{0}: {1}\r\nx-ratelimit-remaining-{0}: {2}\r\nx-ratelimit-reset-{0}: {3}\r\n",
                   kind, b.limit, b.remaining, admission::format_reset(b.reset_ms));
  };
  if (h.has_requests) put("requests", h.requests);
  if (h.has_tokens) put("tokens", h.tokens);
  if (!t) co_return std::move(t.error());
  ticket_ = std::move(*t);
  co_return std::nullopt;
}

void Session::settle() {
  if (principal_ && w_.admission()) {
    api::Usage u;
    if (ctx_.has_usage) {
      u = ctx_.usage;
    } else if (ctx_.upstream_status >= 200 && ctx_.upstream_status < 300) {
      // No usage, but the upstream accepted the request and worked on it
      // (the client left mid-stream, or the stream broke): charge the prompt
      // as estimated and one token per content event relayed. An upstream
      // that failed or refused (no 2xx head, a 4xx/5xx) is charged nothing.
      u.prompt_tokens = prompt_tokens_;
      u.completion_tokens = ctx_.events;
      u.total_tokens = u.prompt_tokens + u.completion_tokens;
    }
    w_.admission()->settle(ticket_, u, std::chrono::steady_clock::now());
    // The request's cost at the model's price, whether or not a budget applies.
    spend_nano_usd_ = price_ ? admission::cost_nano_usd(*price_, u) : 0;
  }
  ticket_.release();
}

// --- the monitor read and the write loop ----------------------------------

void Session::start_monitor() {
  if (reading_ || peer_gone_) return;
  reading_ = true;
  sock_.async_read_some(in_.prepare(kMonitorRead), [this](error_code ec, std::size_t n) {
    reading_ = false;
    if (!ec) {
      in_.commit(n);  // the start of a pipelined request: keep it
    } else if (!(monitor_cancelled_ && ec == asio::error::operation_aborted)) {
      on_peer_gone();
    }
    monitor_cancelled_ = false;
    read_done_.notify();
  });
}

void Session::on_peer_gone() {
  peer_gone_ = true;
  // Abort the upstream request at once so the model server stops generating
  // (not needed once it sent [DONE]: relay_stream reads its last bytes).
  if (upstream_ && !done_relayed_) upstream_->abort(http::UpstreamFailure::cancelled);
}

void Session::queue_body(std::string_view bytes) {
  if (chunked_) {  // one chunk (RFC 9112 §7.1)
    http::append_hex(out_, bytes.size());
    out_ += "\r\n";
    out_ += bytes;
    out_ += "\r\n";
  } else {  // HTTP/1.0: the body ends when the connection closes
    out_ += bytes;
  }
}

void Session::start_write() {
  if (writing_ || out_.empty()) return;
  if (write_failed_) {
    out_.clear();
    return;
  }
  // Send now: a client that keeps up takes it all, and then no completion
  // is queued (one trip through the scheduler less per event). What the
  // socket did not take goes out through the write loop below.
  error_code ec;
  const std::size_t sent = sock_.write_some(asio::buffer(out_), ec);
  ctx_.bytes_out += sent;
  w_.metrics().bytes_out += sent;
  if (!ec && sent == out_.size()) {
    out_.clear();
    return;
  }
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
    write_failed_ = true;
    out_.clear();
    on_peer_gone();
    return;
  }
  out_.erase(0, sent);
  writing_ = true;
  std::swap(out_, wbuf_);
  watchdog_.expires_after(w_.config().server.write_timeout);
  asio::async_write(sock_, asio::buffer(wbuf_), [this](error_code ec, std::size_t n) {
    writing_ = false;
    ctx_.bytes_out += n;
    w_.metrics().bytes_out += n;
    wbuf_.clear();
    if (ec) {
      write_failed_ = true;
      out_.clear();
      on_peer_gone();
      write_done_.notify();
      return;
    }
    if (!out_.empty()) {
      start_write();
      return;
    }
    watchdog_.disarm();
    write_done_.notify();
  });
}

http::Task<void> Session::drain_writes() {
  while (writing_) co_await write_done_.wait();
}

http::Task<bool> Session::write_all(std::string_view a, std::string_view b) {
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(a.data(), a.size()), asio::buffer(b.data(), b.size())};
  watchdog_.expires_after(w_.config().server.write_timeout);
  auto [ec, n] = co_await http::write_all_now(sock_, bufs);
  watchdog_.disarm();
  ctx_.bytes_out += n;
  w_.metrics().bytes_out += n;
  if (ec) {
    write_failed_ = true;
    peer_gone_ = true;
    if (ctx_.status == 0 || ctx_.status < 499) ctx_.status = 499;
    co_return false;
  }
  co_return true;
}

http::Task<void> Session::respond(int status, std::string_view content_type, std::string_view body,
                                  std::string_view extra_headers) {
  ctx_.status = status;
  head_.clear();
  http::append_status_line(head_, status);
  http::append_header(head_, "Content-Type", content_type);
  head_ += "Content-Length: ";
  append_uint(head_, body.size());
  head_ += "\r\n";
  http::append_header(head_, "x-request-id", ctx_.request_id);
  head_ += rl_headers_;
  head_ += extra_headers;
  append_http_date(head_);
  append_connection_header(head_);
  head_ += "\r\n";
  const bool head_only = parser_ && parser_->is_header_done() && parser_->get().method() == bh::verb::head;
  co_await write_all(head_, head_only ? std::string_view{} : body);
}

http::Task<void> Session::respond_error(const core::Error& e) {
  ctx_.set_error(e);
  scratch_.clear();
  core::append_error_json(scratch_, e);
  std::string extra;
  if (e.retry_after_s > 0) extra = fmt::format("Retry-After: {}\r\n", e.retry_after_s);
  co_await respond(e.status, "application/json", scratch_, extra);
}

http::Task<void> Session::lingering_close() {
  error_code ec;
  sock_.shutdown(http::tcp::socket::shutdown_send, ec);
  if (ec) co_return;
  // Read and discard for up to 2 s or 1 MiB, whichever first.
  watchdog_.expires_after(std::chrono::seconds(2));
  std::array<char, 8192> sink;
  std::size_t total = 0;
  for (;;) {
    if (reading_) break;
    auto [rec, n] = co_await sock_.async_read_some(asio::buffer(sink), use_task);
    total += n;
    if (rec || total > (1u << 20)) break;
  }
  watchdog_.disarm();
}

http::Task<void> Session::serve_metrics() {
  std::string text;
  co_await collect_metrics_text(w_, text);
  co_await respond(200, "text/plain; version=0.0.4; charset=utf-8", text);
}

// --- the log phase ----------------------------------------------------------

void Session::log_request() {
  const auto end = core::now();
  auto& m = w_.metrics();
  if (ctx_.status == 0) ctx_.status = peer_gone_ ? 499 : 500;
  if (ctx_.status == 499 && !ctx_.has_error) {
    // Every 499 says why, as the body-read and slow-client ones already do.
    ctx_.has_error = true;
    ctx_.error_source = core::ErrorSource::client;
    ctx_.error_code = "client_closed_request";
  }
  settle();
  m.count_request(ctx_.route, ctx_.model_slot, ctx_.status);
  m.duration(ctx_.model_slot).observe_us(core::micros_between(ctx_.t_start, end));
  if (ctx_.t_first_token != core::TimePoint{})
    m.ttft(ctx_.model_slot).observe_us(core::micros_between(ctx_.t_start, ctx_.t_first_token));
  if (ctx_.t_upstream_done != core::TimePoint{} && ctx_.t_upstream_sent != core::TimePoint{})
    m.upstream_time(ctx_.model_slot).observe_us(core::micros_between(ctx_.t_upstream_sent, ctx_.t_upstream_done));
  if (ctx_.t_upstream_sent != core::TimePoint{}) m.added().observe_us(ctx_.added_us);
  if (ctx_.has_usage) m.add_tokens(ctx_.model_slot, ctx_.usage.prompt_tokens, ctx_.usage.completion_tokens);
  m.sse_events += ctx_.events;

  auto& log = w_.access_log();
  if (!log.enabled()) {
    end_request();
    return;
  }
  std::string& out = log.begin_line();
  out += R"({"ts":")";
  append_timestamp(out);
  out += R"(","request_id":)";
  core::append_json_string(out, ctx_.request_id);
  out += R"(,"method":)";
  core::append_json_string(out, ctx_.method);
  out += R"(,"path":)";
  core::append_json_string(out, ctx_.path);
  out += R"(,"model":)";
  // Client-supplied, any length and any bytes: capped here, made valid UTF-8 by the escaper.
  if (ctx_.model.empty()) out += "null";
  else core::append_json_string(out, core::utf8_prefix(ctx_.model, core::kMaxEchoBytes));
  const auto& cfg = w_.config();
  out += R"(,"pool":)";
  if (ctx_.pool < 0) out += "null";
  else core::append_json_string(out, cfg.pools[static_cast<std::size_t>(ctx_.pool)].name);
  out += R"(,"endpoint":)";
  if (ctx_.pool < 0 || ctx_.endpoint < 0) out += "null";
  else
    core::append_json_string(
        out, cfg.pools[static_cast<std::size_t>(ctx_.pool)].endpoints[static_cast<std::size_t>(ctx_.endpoint)].display);
  if (principal_) {
    out += R"(,"tenant":)";
    core::append_json_string(out, principal_->tenant_name());
    out += R"(,"key_id":)";
    if (principal_->key_id().empty()) out += "null";
    else core::append_json_string(out, core::utf8_prefix(principal_->key_id(), core::kMaxEchoBytes));  // Redis: any id
    fmt::format_to(std::back_inserter(out), R"(,"spend_usd":{:.9f})", static_cast<double>(spend_nano_usd_) / 1e9);
  }
  fmt::format_to(std::back_inserter(out), R"(,"status":{},"stream":{})", ctx_.status, ctx_.stream);
  auto ms = [&](core::TimePoint a, core::TimePoint b) {
    return static_cast<double>(core::micros_between(a, b)) / 1000.0;
  };
  if (ctx_.t_first_token != core::TimePoint{})
    fmt::format_to(std::back_inserter(out), R"(,"ttft_ms":{:.3f})", ms(ctx_.t_start, ctx_.t_first_token));
  else
    out += R"(,"ttft_ms":null)";
  fmt::format_to(std::back_inserter(out), R"(,"duration_ms":{:.3f})", ms(ctx_.t_start, end));
  if (ctx_.t_upstream_sent != core::TimePoint{} && ctx_.t_upstream_done != core::TimePoint{})
    fmt::format_to(std::back_inserter(out), R"(,"upstream_ms":{:.3f})", ms(ctx_.t_upstream_sent, ctx_.t_upstream_done));
  else
    out += R"(,"upstream_ms":null)";
  fmt::format_to(std::back_inserter(out), R"(,"added_us":{},"bytes_in":{},"bytes_out":{},"events":{},"retries":{})",
                 ctx_.added_us, ctx_.bytes_in, ctx_.bytes_out, ctx_.events, ctx_.retries);
  if (ctx_.has_usage)
    fmt::format_to(std::back_inserter(out), R"(,"prompt_tokens":{},"completion_tokens":{})", ctx_.usage.prompt_tokens,
                   ctx_.usage.completion_tokens);
  else
    out += R"(,"prompt_tokens":null,"completion_tokens":null)";
  if (ctx_.has_error) {
    out += R"(,"error":{"source":")";
    out += core::to_string(ctx_.error_source);
    out += R"(","code":)";
    core::append_json_string(out, ctx_.error_code);
    out += "}";
  } else {
    out += R"(,"error":null)";
  }
  out += "}";
  log.end_line();
  end_request();
}

void Session::end_request() {
  principal_.reset();
  price_ = nullptr;
  spend_nano_usd_ = 0;
  prompt_tokens_ = 0;
  strip_usage_ = false;
  rl_headers_.clear();
}

}  // namespace weir::gateway
