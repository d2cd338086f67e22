// weir-mock's HTTP/1.1 server (see server.hpp).
#include "server.hpp"

#include <algorithm>
#include <charconv>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include "wire.hpp"

namespace weir::mock {

namespace beast = boost::beast;
namespace http = beast::http;
using boost::system::error_code;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kHeaderLimit = 64 * 1024;      // bytes of request head
constexpr std::uint64_t kBodyLimit = 64ull << 20;    // bytes of request body (64 MiB)
constexpr std::size_t kReadBufferMax = 1 << 20;      // bytes buffered ahead (pipelining)
constexpr auto kRequestTimeout = 30s;                // first byte -> whole request read
constexpr auto kWriteTimeout = 60s;                  // a response must drain within this
constexpr auto kDrainTimeout = 2s;                   // lingering close after "connection: close"
constexpr auto kTickSlack = 200us;                   // entries due this soon go out in the current tick
constexpr std::string_view kVllmVersion = "0.10.1";  // the vLLM release whose wire format we follow

// Per-request fault settings: flags, overridden by x-mock-* headers.
struct Faults {
  int ttft_ms = 0;
  int itl_ms = 0;
  int status = 0;        // 0: none
  int stall_after = -1;  // tokens before the stall; -1: none
  int stall_ms = 0;
  int reset_after = -1;  // tokens before the RST; -1: none
  bool gzip = false;
  bool empty_body = false;
  bool echo = false;
  int tool_calls = 0;     // chat: tool calls after the text
  int reasoning = 0;      // chat: the first N tokens as reasoning_content
  bool stop_hit = false;  // chat: end on the request's first stop string
};

std::string_view path_of(std::string_view target) {
  const auto q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

// Header values never hold CR/LF once parsed, but be strict anyway.
std::string sanitize(std::string_view v) {
  std::string out;
  for (char c : v)
    if (c != '\r' && c != '\n' && c != '\0') out += c;
  return out;
}

}  // namespace

using TlsStream = asio::ssl::stream<Socket>;

// One accepted socket: reads requests one after another (keep-alive), answers
// simple endpoints at once and runs generations on the worker's scheduler.
// Lives as long as an operation or a scheduler entry holds a shared_ptr to it.
// `Stream` is the socket itself (plain HTTP) or a TlsStream over it (HTTPS,
// after the server handshake); the code is the same but for the handshake and
// flush()'s direct write, which only the plain socket takes.
template <class Stream>
class ConnectionT final : public Connection {
  static constexpr bool kTls = !std::is_same_v<Stream, Socket>;

 public:
  // (Worker, Socket) for plain; (Worker, Socket, ssl::context&) for TLS.
  template <class... Args>
  explicit ConnectionT(Worker& w, Args&&... stream_args)
      : w_(w), stream_(std::forward<Args>(stream_args)...), rbuf_(kReadBufferMax) {
    w_.add(this);
  }
  ~ConnectionT() override {
    if (phase_ == Phase::generating) end_generation(Finish::abort);
    w_.remove(this);
  }

  void start() {
    error_code ec;
    sock().set_option(Tcp::no_delay(true), ec);
    if constexpr (kTls) {
      // The handshake must finish within the request timeout (the sweep closes it otherwise).
      deadline_ = Clock::now() + kRequestTimeout;
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = self_ptr()](error_code e) { self->on_handshake(e); });
    } else {
      sock().non_blocking(true, ec);  // flush() writes directly when it can
      do_idle();
    }
  }

  void on_due(std::uint64_t gen, Clock::time_point now) override;

  void expire() override {
    if (phase_ == Phase::generating) end_generation(Finish::abort);
    close();
  }

 private:
  std::shared_ptr<ConnectionT> self_ptr() { return std::static_pointer_cast<ConnectionT>(shared_from_this()); }
  Socket& sock() { return beast::get_lowest_layer(stream_); }
  void on_handshake(error_code ec);

  enum class Phase : std::uint8_t { idle, reading, responding, generating, draining, closed };
  using Request = http::request<http::string_body>;

  void do_idle();
  void start_watch();
  void on_watch(error_code ec, std::size_t n);
  void read_request();
  void on_header(error_code ec);
  void on_request(error_code ec);
  void on_read_error(error_code ec);
  void dispatch();
  void start_generation(Endpoint ep);
  // The generation leaves the waiting queue and runs (at once without --max-num-seqs).
  void begin(std::uint64_t gen);
  std::optional<std::string> read_faults(const Request& req);
  std::string echo_headers(const Request& req);
  void queue_head(int status, std::string_view content_type, std::size_t length, std::string_view extra, bool gzip,
                  bool chunked);
  void respond(int status, std::string_view content_type, std::string body, std::string_view extra = {},
               bool gzip = false);
  void respond_error(int status, std::string_view message, std::string_view type = {});
  void respond_fatal(int status, std::string_view content_type, std::string body);
  void flush();
  void on_write(error_code ec);
  void after_response();
  Clock::time_point due(int step) const;
  // --stamp: ns from the request fully read to now; -1 without --stamp.
  std::int64_t stamp_ns() const {
    if (!w_.cfg().stamp) return -1;
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t_start_).count();
  }
  // The RST (--reset-after, x-mock-reset-after) is at a position in the
  // message: a generation that starts past it (a continuation) does not get it.
  bool reset_due() const { return faults_.reset_after >= 0 && (plan_.start == 0 || plan_.start < faults_.reset_after); }
  void end_generation(Finish reason);
  void release_engine();
  void do_reset();
  void lingering_close();
  void close();

  Worker& w_;
  Stream stream_;
  beast::flat_buffer rbuf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::idle;
  bool read_pending_ = false;  // a read (watch or request) is outstanding
  bool writing_ = false;       // an async_write is outstanding
  bool keep_alive_ = true;
  bool head_ = false;         // HEAD request: headers only
  bool close_after_ = false;  // close once the queued bytes are written
  std::string out_;           // bytes queued behind the write in flight
  std::string wbuf_;          // bytes of the write in flight
  std::string scratch_;       // chunk JSON under construction

  // The request being served.
  Plan plan_;
  Faults faults_;
  std::string echo_;           // x-mock-* echo header lines, or empty
  Clock::time_point t_start_;  // request fully read
  std::uint64_t gen_ = 0;      // generation number; older scheduler entries are stale
  int step_ = 0;               // next streaming step (token position)
  bool streaming_ = false;     // this generation answers with SSE
  bool last_queued_ = false;   // the generation's final bytes are queued
  std::int64_t kv_held_ = 0;   // tokens this generation adds to kv_tokens
  // The engine model (engine.hpp; only with --max-num-seqs / --prefix-cache-tokens):
  std::int64_t delay_us_ = 0;          // waiting for a batch slot plus prefill of the uncached prompt, µs
  std::uint64_t ticket_ = 0;           // Engine::admit's, while waiting
  bool admitted_ = false;              // running: counted in vllm:num_requests_running, holds kv_held_
  bool holds_slot_ = false;            // holds one of --max-num-seqs' slots
  std::vector<std::uint64_t> blocks_;  // the prompt's block hashes (prefix cache)
};

// ---------------------------------------------------------------------------
// Reading requests

// TLS: the server handshake is done (or failed); then serve as over plain HTTP.
template <class Stream>
void ConnectionT<Stream>::on_handshake(error_code ec) {
  if constexpr (kTls) {
    if (phase_ == Phase::closed) return;
    if (ec) {
      bump(w_.metrics().tls_handshake_failures, std::uint64_t{1});
      return close();
    }
    bump(w_.metrics().tls_handshakes[SSL_session_reused(stream_.native_handle()) == 1 ? 1 : 0], std::uint64_t{1});
    do_idle();
  }
}

template <class Stream>
void ConnectionT<Stream>::do_idle() {
  phase_ = Phase::idle;
  deadline_ = Clock::now() + std::chrono::seconds(w_.cfg().keep_alive_s);
  if (rbuf_.size() > 0) return read_request();
  if (!read_pending_) start_watch();
}

// One read_some outstanding: while idle it waits for the next request's first
// bytes; while generating it notices the client going away.
template <class Stream>
void ConnectionT<Stream>::start_watch() {
  const std::size_t room = rbuf_.max_size() - rbuf_.size();
  if (room == 0) return;  // a client pipelining 1 MiB ahead: stop watching until we catch up
  read_pending_ = true;
  stream_.async_read_some(rbuf_.prepare(std::min<std::size_t>(room, 16384)),
                          [self = self_ptr()](error_code ec, std::size_t n) { self->on_watch(ec, n); });
}

template <class Stream>
void ConnectionT<Stream>::on_watch(error_code ec, std::size_t n) {
  read_pending_ = false;
  if (phase_ == Phase::closed) return;
  if (ec) {
    if (phase_ == Phase::generating) end_generation(Finish::abort);  // the client went away
    return close();
  }
  rbuf_.commit(n);
  switch (phase_) {
    case Phase::idle:
      return read_request();
    case Phase::draining:
      rbuf_.consume(rbuf_.size());
      return start_watch();
    case Phase::generating:
    case Phase::responding:
      return start_watch();  // pipelined bytes wait in rbuf_
    default:
      return;
  }
}

template <class Stream>
void ConnectionT<Stream>::read_request() {
  phase_ = Phase::reading;
  deadline_ = Clock::now() + kRequestTimeout;
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(kBodyLimit);
  read_pending_ = true;
  http::async_read_header(stream_, rbuf_, *parser_,
                          [self = self_ptr()](error_code ec, std::size_t) { self->on_header(ec); });
}

// The head is in. Answer `Expect: 100-continue` (curl sends it for bodies
// over 1 KiB; uvicorn answers it) while the body is read.
template <class Stream>
void ConnectionT<Stream>::on_header(error_code ec) {
  read_pending_ = false;
  if (phase_ == Phase::closed) return;
  if (ec) return on_read_error(ec);
  if (!parser_->is_done() && beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
    out_ += "HTTP/1.1 100 Continue\r\n\r\n";
    flush();
  }
  read_pending_ = true;
  http::async_read(stream_, rbuf_, *parser_, [self = self_ptr()](error_code e, std::size_t) { self->on_request(e); });
}

template <class Stream>
void ConnectionT<Stream>::on_request(error_code ec) {
  read_pending_ = false;
  if (phase_ == Phase::closed) return;
  if (!ec) return dispatch();
  on_read_error(ec);
}

template <class Stream>
void ConnectionT<Stream>::on_read_error(error_code ec) {
  keep_alive_ = false;
  if (ec == http::error::body_limit)
    return respond_fatal(
        413, "application/json",
        error_body(413, fmt::format("Request body exceeds weir-mock's limit of {} bytes", kBodyLimit)));
  if (ec == http::error::header_limit)
    return respond_fatal(431, "text/plain; charset=utf-8", "Request Header Fields Too Large");
  // Bad bytes: answer as uvicorn does. A clean or abrupt close: just close.
  if (ec.category() == http::make_error_code(http::error::bad_method).category() && ec != http::error::end_of_stream &&
      ec != http::error::partial_message)
    return respond_fatal(400, "text/plain; charset=utf-8", "Invalid HTTP request received.");
  close();
}

template <class Stream>
void ConnectionT<Stream>::dispatch() {
  Request& req = parser_->get();
  t_start_ = Clock::now();
  keep_alive_ = req.keep_alive() && !w_.cfg().no_keep_alive;
  head_ = req.method() == http::verb::head;
  close_after_ = false;
  echo_.clear();
  const std::string_view path = path_of(req.target());
  const bool get = req.method() == http::verb::get || head_;
  const bool post = req.method() == http::verb::post;

  const auto not_allowed = [&](std::string_view allow) {
    respond(405, "application/json", error_body(405, "Method Not Allowed", "Method Not Allowed"),
            fmt::format("allow: {}\r\n", allow));
  };
  if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/embeddings") {
    if (!post) return not_allowed("POST");
    return start_generation(path == "/v1/chat/completions" ? Endpoint::chat
                            : path == "/v1/completions"    ? Endpoint::completion
                                                           : Endpoint::embedding);
  }
  if (path == "/tokenize") {
    if (!post) return not_allowed("POST");
    std::string body;
    if (auto err = tokenize_body(req.body(), w_.cfg(), body))
      return respond(err->status, "application/json", error_body(err->status, err->message));
    return respond(200, "application/json", std::move(body));
  }
  {
    std::string body;
    bool handled = false;
    auto err = extra_route_body(path, req.body(), w_.cfg(), std::time(nullptr), body, handled);
    if (handled) {
      if (!post) return not_allowed("POST");
      if (err) return respond(err->status, "application/json", error_body(err->status, err->message));
      return respond(200, "application/json", std::move(body));
    }
  }
  if (path == "/v1/audio/transcriptions" || path == "/v1/audio/translations") {
    if (!post) return not_allowed("POST");
    std::string body, content_type;
    if (auto err = audio_body(path, req[http::field::content_type], req.body(), w_.cfg(), std::time(nullptr), body,
                              content_type))
      return respond(err->status, "application/json", error_body(err->status, err->message));
    const std::string_view echo = req["x-mock-echo"];
    return respond(200, content_type, std::move(body), !echo.empty() && echo != "0" ? echo_headers(req) : "");
  }
  if (path == "/health") {
    if (!get) return not_allowed("GET");
    return respond(200, {}, {});  // vLLM: Response(status_code=200), no body, no content-type
  }
  if (path == "/v1/models") {
    if (!get) return not_allowed("GET");
    return respond(200, "application/json", models_body(w_.cfg(), std::time(nullptr), w_.rng()));
  }
  if (path == "/metrics") {
    if (!get) return not_allowed("GET");
    return respond(200, "text/plain; version=0.0.4; charset=utf-8",
                   render_metrics(w_.all_metrics(), w_.cfg(), w_.engine()));
  }
  if (path == "/version") {
    if (!get) return not_allowed("GET");
    return respond(200, "application/json", fmt::format("{{\"version\":\"{}\"}}", kVllmVersion));
  }
  respond(404, "application/json", error_body(404, "Not Found", "Not Found"));
}

// ---------------------------------------------------------------------------
// Generations

template <class Stream>
std::optional<std::string> ConnectionT<Stream>::read_faults(const Request& req) {
  const MockConfig& cfg = w_.cfg();
  faults_ = Faults{};
  faults_.ttft_ms = cfg.ttft_ms;
  faults_.itl_ms = cfg.itl_ms;
  faults_.stall_after = cfg.stall_after;
  faults_.stall_ms = cfg.stall_ms;
  faults_.reset_after = cfg.reset_after;
  // --reset-rate: only this share of the generations get --reset-after (x-mock-reset-after always does).
  if (cfg.reset_after >= 0 && cfg.reset_rate < 1.0 && !(w_.rng().uniform() < cfg.reset_rate)) faults_.reset_after = -1;

  const auto flag = [&](std::string_view name, bool& out) -> std::optional<std::string> {
    const std::string_view v = req[name];
    if (v.empty() || v == "0" || v == "false" || v == "no") return std::nullopt;
    if (v == "1" || v == "true" || v == "yes") {
      out = true;
      return std::nullopt;
    }
    return fmt::format("invalid {} header: expected 1 or 0", name);
  };
  if (auto e = flag("x-mock-gzip", faults_.gzip)) return e;
  if (auto e = flag("x-mock-empty-body", faults_.empty_body)) return e;
  if (auto e = flag("x-mock-echo", faults_.echo)) return e;
  if (auto e = flag("x-mock-stop-hit", faults_.stop_hit)) return e;
  if (faults_.echo) echo_ = echo_headers(req);

  const auto number = [&](std::string_view name, int& out, int lo, int hi) -> std::optional<std::string> {
    const std::string_view v = req[name];
    if (v.empty()) return std::nullopt;
    int x = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc{} || p != v.data() + v.size() || x < lo || x > hi)
      return fmt::format("invalid {} header: expected an integer in [{}, {}]", name, lo, hi);
    out = x;
    return std::nullopt;
  };
  constexpr int kHour = 3600 * 1000;
  if (auto e = number("x-mock-ttft-ms", faults_.ttft_ms, 0, kHour)) return e;
  if (auto e = number("x-mock-itl-ms", faults_.itl_ms, 0, kHour)) return e;
  if (auto e = number("x-mock-status", faults_.status, 400, 599)) return e;
  if (auto e = number("x-mock-stall-after", faults_.stall_after, 0, 1 << 30)) return e;
  if (auto e = number("x-mock-stall-ms", faults_.stall_ms, 0, kHour)) return e;
  if (auto e = number("x-mock-reset-after", faults_.reset_after, 0, 1 << 30)) return e;
  if (auto e = number("x-mock-tool-calls", faults_.tool_calls, 0, 8)) return e;
  if (auto e = number("x-mock-reasoning", faults_.reasoning, 0, 1 << 30)) return e;
  return std::nullopt;
}

// x-mock-echo: what arrived, so a test can prove a proxy delivered it intact.
template <class Stream>
std::string ConnectionT<Stream>::echo_headers(const Request& req) {
  const std::string& body = req.body();
  std::string h = fmt::format("x-mock-body-bytes: {}\r\nx-mock-body-sha256: {}\r\n", body.size(), sha256_hex(body));
  if (const auto it = req.find("x-request-id"); it != req.end())
    h += fmt::format("x-mock-request-id: {}\r\n", sanitize(it->value()));
  boost::system::error_code ec;
  const auto doc = boost::json::parse(body, ec);
  if (!ec && doc.is_object())
    if (const auto* m = doc.get_object().if_contains("model"); m != nullptr && m->is_string())
      h += fmt::format("x-mock-model: {}\r\n", sanitize(m->get_string()));
  std::string names;
  for (const auto& f : req) {
    if (!names.empty()) names += ',';
    for (char c : f.name_string()) names += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  h += fmt::format("x-mock-headers: {}\r\n", sanitize(names));
  // W3C Trace Context as received (a proxy must continue the trace with its own span id).
  for (std::string_view name : {std::string_view("traceparent"), std::string_view("tracestate")}) {
    std::string values;
    for (auto [it, end] = req.equal_range(name); it != end; ++it) {
      if (!values.empty()) values += ',';
      values += it->value();
    }
    if (!values.empty()) h += fmt::format("x-mock-{}: {}\r\n", name, sanitize(values));
  }
  return h;
}

template <class Stream>
void ConnectionT<Stream>::start_generation(Endpoint ep) {
  Request& req = parser_->get();
  if (auto err = read_faults(req)) return respond_error(400, *err);
  MetricsShard& m = w_.metrics();
  if (const std::string_view to = req["x-mock-redirect"]; !to.empty()) {
    // An absolute redirect built from the Host header, as uvicorn/Starlette's
    // trailing-slash redirect is: what a gateway must not pass on verbatim.
    parser_.reset();
    return respond(
        307, "application/json", "{}",
        fmt::format("Location: http://{}{}\r\n", sanitize(req[boost::beast::http::field::host]), sanitize(to)), false);
  }
  if (faults_.status != 0) {
    bump(m.injected_errors, std::uint64_t{1});
    return respond_error(faults_.status, fmt::format("weir-mock: injected error (x-mock-status: {})", faults_.status));
  }
  if (w_.cfg().error_rate > 0 && w_.rng().uniform() < w_.cfg().error_rate) {
    bump(m.injected_errors, std::uint64_t{1});
    return respond_error(w_.cfg().error_status, "weir-mock: injected error (--error-rate)");
  }
  if (auto err = build_plan(ep, req.body(), req["x-request-id"], w_.cfg(), w_.rng(), plan_))
    return respond_error(err->status, err->message);
  if (ep == Endpoint::chat) {
    plan_.tool_calls = faults_.tool_calls;
    plan_.reasoning_tokens = faults_.reasoning;
    plan_.stop_hit = faults_.stop_hit && !plan_.stop_string.empty();
  }
  Engine& engine = w_.engine();
  blocks_.clear();
  if (engine.cache_on()) prompt_block_hashes(req.body(), ep == Endpoint::chat, blocks_);
  parser_.reset();  // the body is no longer needed

  ++gen_;
  step_ = plan_.start;
  last_queued_ = false;
  phase_ = Phase::generating;
  deadline_ = Clock::time_point::max();
  streaming_ = plan_.stream && !faults_.empty_body && ep != Endpoint::embedding;
  admitted_ = false;
  holds_slot_ = false;
  delay_us_ = 0;
  bump(m.prompt_tokens, plan_.total_prompt_tokens);

  if (streaming_) {
    // Headers go out at once, as Starlette's StreamingResponse sends them
    // before the first body chunk (even while vLLM queues the request);
    // tokens follow from the scheduler.
    queue_head(200, "text/event-stream; charset=utf-8", 0, echo_, false, true);
    flush();
  }
  if (!read_pending_) start_watch();
  if (!engine.batch_bounded()) return begin(gen_);
  // A bounded batch: wait for a slot (vllm:num_requests_waiting), started on this worker's thread.
  ticket_ = engine.admit(
      [self = self_ptr(), gen = gen_, &ioc = w_.ioc()] { asio::post(ioc, [self, gen] { self->begin(gen); }); });
}

template <class Stream>
void ConnectionT<Stream>::begin(std::uint64_t gen) {
  Engine& engine = w_.engine();
  if (gen != gen_ || phase_ != Phase::generating) {
    // Gone while its start was on its way: the slot passes on.
    if (engine.batch_bounded()) engine.release();
    return;
  }
  MetricsShard& m = w_.metrics();
  admitted_ = true;
  ticket_ = 0;
  holds_slot_ = engine.batch_bounded();
  // Prefill: only the prompt tokens not already in the prefix cache cost time.
  const std::uint64_t cached = engine.cache_on() ? engine.lookup_and_insert(blocks_, plan_.total_prompt_tokens) : 0;
  const auto uncached = static_cast<std::int64_t>(plan_.total_prompt_tokens - cached);
  delay_us_ = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t_start_).count() +
              uncached * w_.cfg().prefill_us_per_token;
  kv_held_ = static_cast<std::int64_t>(plan_.total_prompt_tokens);
  bump(m.running, std::int64_t{1});
  bump(m.kv_tokens, kv_held_);
  if (streaming_) {
    w_.schedule(due(plan_.start), self_ptr(), gen_);
  } else {
    // The whole answer leaves when the last token would have.
    int at = plan_.endpoint == Endpoint::embedding ? 0 : plan_.tokens - 1;
    if (reset_due()) at = std::min(at, faults_.reset_after);
    w_.schedule(due(at), self_ptr(), gen_);
  }
}

// When token `step` (0-based, from plan_.start) is due: ttft, then one every
// itl, shifted by the stall once the message holds `stall_after` tokens (a
// continuation that starts past that point does not stall).
template <class Stream>
Clock::time_point ConnectionT<Stream>::due(int step) const {
  auto ms = static_cast<std::int64_t>(faults_.ttft_ms) + static_cast<std::int64_t>(step - plan_.start) * faults_.itl_ms;
  if (faults_.stall_after >= 0 && step >= faults_.stall_after &&
      (plan_.start == 0 || plan_.start < faults_.stall_after))
    ms += faults_.stall_ms;
  return t_start_ + std::chrono::milliseconds(ms) + std::chrono::microseconds(delay_us_);
}

template <class Stream>
void ConnectionT<Stream>::on_due(std::uint64_t gen, Clock::time_point now) {
  if (gen != gen_ || phase_ != Phase::generating || last_queued_) return;
  MetricsShard& m = w_.metrics();
  if (!streaming_) {
    const int at = plan_.endpoint == Endpoint::embedding ? 0 : plan_.tokens - 1;
    if (reset_due() && faults_.reset_after <= at) return do_reset();
    m.lag.observe(std::chrono::duration<double>(now - due(at)).count());
    if (plan_.endpoint != Endpoint::embedding) {
      m.ttft.observe(std::chrono::duration<double>(due(plan_.start) - t_start_).count());
      bump(m.generation_tokens, plan_.completion_tokens());
    }
    std::string body;
    if (!faults_.empty_body) append_full_body(plan_, body, stamp_ns());
    last_queued_ = true;
    const bool gzip = faults_.gzip;
    if (gzip && !body.empty()) body = gzip_compress(body);
    queue_head(200, "application/json", body.size(), echo_, gzip, false);
    if (!head_) out_ += body;
    deadline_ = now + kWriteTimeout;
    return flush();
  }

  if (reset_due() && step_ >= faults_.reset_after) return do_reset();
  m.lag.observe(std::chrono::duration<double>(now - due(step_)).count());
  if (step_ == plan_.start) m.ttft.observe(std::chrono::duration<double>(now - t_start_).count());
  // An RST at the message's length: the last token (and its finish_reason)
  // goes out, then the RST one itl later, before the usage chunk and [DONE].
  const bool cut_at_end = reset_due() && faults_.reset_after == plan_.tokens;
  append_stream_step(plan_, step_, scratch_, out_, !cut_at_end, step_ == plan_.start ? stamp_ns() : -1);
  const auto produced = static_cast<std::uint64_t>(plan_.choices());
  bump(m.generation_tokens, produced);
  bump(m.kv_tokens, static_cast<std::int64_t>(produced));
  kv_held_ += static_cast<std::int64_t>(produced);
  if (step_ == plan_.tokens - 1 && !cut_at_end) {
    last_queued_ = true;
    deadline_ = now + kWriteTimeout;
  } else {
    ++step_;
    w_.schedule(due(step_), self_ptr(), gen_);
  }
  flush();
}

// Counts the generation's end and releases what it held. Idempotent per generation.
template <class Stream>
void ConnectionT<Stream>::end_generation(Finish reason) {
  if (phase_ != Phase::generating) return;
  MetricsShard& m = w_.metrics();
  bump(m.success[static_cast<std::size_t>(reason)], std::uint64_t{1});
  release_engine();
  if (reason != Finish::abort) m.e2e.observe(std::chrono::duration<double>(Clock::now() - t_start_).count());
  ++gen_;  // stale scheduler entries ignore themselves
  phase_ = Phase::responding;
}

// What a running (or waiting) generation holds: its count in
// vllm:num_requests_running and kv_tokens, its batch slot, its queue place.
template <class Stream>
void ConnectionT<Stream>::release_engine() {
  MetricsShard& m = w_.metrics();
  if (admitted_) {
    bump(m.running, std::int64_t{-1});
    bump(m.kv_tokens, -kv_held_);
    kv_held_ = 0;
    admitted_ = false;
    if (holds_slot_) w_.engine().release();
    holds_slot_ = false;
  } else if (w_.engine().batch_bounded() && ticket_ != 0) {
    w_.engine().cancel(ticket_);  // false: its start is posted already; begin() passes the slot on
  }
  ticket_ = 0;
}

// x-mock-reset-after / --reset-after: abort the TCP connection with an RST
// (SO_LINGER 0), as a crashed or killed model server would.
template <class Stream>
void ConnectionT<Stream>::do_reset() {
  MetricsShard& m = w_.metrics();
  bump(m.injected_resets, std::uint64_t{1});
  release_engine();
  ++gen_;
  phase_ = Phase::responding;
  error_code ec;
  sock().set_option(asio::socket_base::linger(true, 0), ec);
  close();
}

// ---------------------------------------------------------------------------
// Writing responses

// Appends a response head as uvicorn writes it: date, server, then the body headers.
template <class Stream>
void ConnectionT<Stream>::queue_head(int status, std::string_view content_type, std::size_t length,
                                     std::string_view extra, bool gzip, bool chunked) {
  fmt::format_to(std::back_inserter(out_), "HTTP/1.1 {} {}\r\ndate: {}\r\nserver: uvicorn\r\n", status,
                 reason_phrase(status), w_.date().now());
  if (chunked) {
    fmt::format_to(std::back_inserter(out_), "content-type: {}\r\ntransfer-encoding: chunked\r\n", content_type);
  } else {
    fmt::format_to(std::back_inserter(out_), "content-length: {}\r\n", length);
    if (!content_type.empty()) fmt::format_to(std::back_inserter(out_), "content-type: {}\r\n", content_type);
  }
  if (gzip) out_ += "content-encoding: gzip\r\n";
  out_ += extra;
  if (!keep_alive_ || close_after_) out_ += "connection: close\r\n";
  out_ += "\r\n";
}

template <class Stream>
void ConnectionT<Stream>::respond(int status, std::string_view content_type, std::string body, std::string_view extra,
                                  bool gzip) {
  if (gzip && !body.empty()) body = gzip_compress(body);
  queue_head(status, content_type, body.size(), extra, gzip, false);
  if (!head_) out_ += body;
  phase_ = Phase::responding;
  deadline_ = Clock::now() + kWriteTimeout;
  flush();
}

// An error for a generation endpoint: vLLM's shape, honouring x-mock-gzip and x-mock-echo.
template <class Stream>
void ConnectionT<Stream>::respond_error(int status, std::string_view message, std::string_view type) {
  parser_.reset();
  respond(status, "application/json", error_body(status, message, type), echo_, faults_.gzip);
}

// A protocol error: answer, then close.
template <class Stream>
void ConnectionT<Stream>::respond_fatal(int status, std::string_view content_type, std::string body) {
  close_after_ = true;
  keep_alive_ = false;
  head_ = false;
  parser_.reset();
  respond(status, content_type, std::move(body));
}

template <class Stream>
void ConnectionT<Stream>::flush() {
  if (writing_ || out_.empty() || phase_ == Phase::closed) return;
  if constexpr (!kTls) {
    if (phase_ == Phase::generating && !last_queued_) {
      // Hot path (every token but the last): the socket buffer almost always
      // has room, so write now and skip the completion-handler round trip. A
      // final write still goes through on_write, which moves the state on.
      // (Not over TLS: a record OpenSSL has sealed must be written whole, so
      // TLS writes all go through async_write.)
      error_code ec;
      const std::size_t n = stream_.write_some(asio::buffer(out_), ec);
      if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
        end_generation(Finish::abort);  // EPIPE / ECONNRESET: the client went away
        return close();
      }
      if (n == out_.size()) return out_.clear();
      out_.erase(0, n);
    }
  }
  wbuf_.swap(out_);
  out_.clear();
  writing_ = true;
  asio::async_write(stream_, asio::buffer(wbuf_),
                    [self = self_ptr()](error_code ec, std::size_t) { self->on_write(ec); });
}

template <class Stream>
void ConnectionT<Stream>::on_write(error_code ec) {
  writing_ = false;
  if (phase_ == Phase::closed) return;
  if (ec) {
    if (phase_ == Phase::generating) end_generation(Finish::abort);
    return close();
  }
  if (!out_.empty()) return flush();
  if (phase_ == Phase::generating) {
    if (!last_queued_) return;
    end_generation(plan_.cut_by_length ? Finish::length : Finish::stop);
    return after_response();
  }
  if (phase_ == Phase::responding) after_response();
}

template <class Stream>
void ConnectionT<Stream>::after_response() {
  parser_.reset();
  if (close_after_ || !keep_alive_) return lingering_close();
  do_idle();
}

// Half-close, then read until the client closes (or kDrainTimeout), so the
// client sees our last bytes instead of an RST for unread input.
template <class Stream>
void ConnectionT<Stream>::lingering_close() {
  phase_ = Phase::draining;
  deadline_ = Clock::now() + kDrainTimeout;
  error_code ec;
  sock().shutdown(Tcp::socket::shutdown_send, ec);
  rbuf_.consume(rbuf_.size());
  if (!read_pending_) start_watch();
}

template <class Stream>
void ConnectionT<Stream>::close() {
  if (phase_ == Phase::closed) return;
  phase_ = Phase::closed;
  deadline_ = Clock::time_point::max();
  error_code ec;
  sock().close(ec);
}

// ---------------------------------------------------------------------------
// TLS context

std::unique_ptr<asio::ssl::context> make_server_tls(const MockConfig& cfg) {
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::single_dh_use);
  // An encrypted key fails to load (no passphrase is given), never a prompt on the terminal.
  SSL_CTX_set_default_passwd_cb(c, [](char*, int, int, void*) { return -1; });
  ctx->use_certificate_chain_file(cfg.tls_cert);
  ctx->use_private_key_file(cfg.tls_key, asio::ssl::context::pem);
  if (SSL_CTX_check_private_key(c) != 1) throw std::runtime_error("the private key does not match the certificate");
  if (cfg.tls_no_resume) {
    // No TLS 1.3 tickets, no TLS 1.2 tickets, no server-side session cache: every handshake is a full one.
    SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
    SSL_CTX_set_num_tickets(c, 0);
  } else {
    static constexpr unsigned char kSidContext[] = "weir-mock";
    SSL_CTX_set_session_id_context(c, kSidContext, sizeof kSidContext - 1);
  }
  // ALPN: choose http/1.1 when the client offers it (as uvicorn's and nginx's TLS do).
  SSL_CTX_set_alpn_select_cb(
      c,
      [](SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
         void*) -> int {
        static constexpr unsigned char kH11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
        unsigned char* chosen = nullptr;
        if (SSL_select_next_proto(&chosen, outlen, kH11, sizeof kH11, in, inlen) != OPENSSL_NPN_NEGOTIATED)
          return SSL_TLSEXT_ERR_NOACK;
        *out = chosen;
        return SSL_TLSEXT_ERR_OK;
      },
      nullptr);
  return ctx;
}

// ---------------------------------------------------------------------------
// Worker

Worker::Worker(const MockConfig& cfg, int index, MetricsShard& shard, const std::vector<MetricsShard*>& shards,
               Engine& engine, asio::ssl::context* tls)
    : cfg_(cfg),
      tls_(tls),
      engine_(engine),
      shard_(shard),
      shards_(shards),
      acceptor_(ioc_.get_executor()),
      tick_timer_(ioc_.get_executor()),
      sweep_timer_(ioc_.get_executor()),
      accept_retry_(ioc_.get_executor()),
      min_tick_(std::chrono::microseconds(cfg.tick_us)),
      rng_(mix64(static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
                 (static_cast<std::uint64_t>(index + 1) << 48))) {}

Worker::~Worker() = default;

std::uint16_t Worker::listen(const Tcp::endpoint& ep) {
  acceptor_.open(ep.protocol());
  acceptor_.set_option(asio::socket_base::reuse_address(true));
  acceptor_.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true));
  acceptor_.bind(ep);
  acceptor_.listen(asio::socket_base::max_listen_connections);
  return acceptor_.local_endpoint().port();
}

void Worker::run() {
  accept();
  sweep();
  for (;;) {
    try {
      ioc_.run();
      return;
    } catch (const std::exception& e) {
      std::cerr << "weir-mock: worker error: " << e.what() << std::endl;
    }
  }
}

void Worker::shutdown() {
  asio::post(ioc_, [this] {
    stopping_ = true;
    error_code ec;
    acceptor_.close(ec);
    tick_timer_.cancel();
    sweep_timer_.cancel();
    accept_retry_.cancel();
    heap_.clear();
    const auto conns = conns_;
    for (Connection* c : conns) c->expire();
  });
}

void Worker::accept() {
  acceptor_.async_accept([this](error_code ec, Socket s) {
    if (stopping_ || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors or similar: back off briefly instead of spinning.
      std::cerr << "weir-mock: accept: " << ec.message() << std::endl;
      accept_retry_.expires_after(50ms);
      accept_retry_.async_wait([this](error_code e) {
        if (!e && !stopping_) accept();
      });
      return;
    }
    bump(shard_.connections, std::uint64_t{1});
    if (tls_ != nullptr)
      std::make_shared<ConnectionT<TlsStream>>(*this, std::move(s), *tls_)->start();
    else
      std::make_shared<ConnectionT<Socket>>(*this, std::move(s))->start();
    accept();
  });
}

void Worker::add(Connection* c) {
  c->registry_index = conns_.size();
  conns_.push_back(c);
}

void Worker::remove(Connection* c) {
  const std::size_t i = c->registry_index;
  if (i >= conns_.size() || conns_[i] != c) return;
  conns_[i] = conns_.back();
  conns_[i]->registry_index = i;
  conns_.pop_back();
}

void Worker::sweep() {
  sweep_timer_.expires_after(500ms);
  sweep_timer_.async_wait([this](error_code ec) {
    if (ec || stopping_) return;
    const auto now = Clock::now();
    const auto conns = conns_;  // expire() never destroys synchronously, but be safe
    for (Connection* c : conns)
      if (c->deadline() <= now) c->expire();
    sweep();
  });
}

namespace {
struct Later {
  template <class D>
  bool operator()(const D& a, const D& b) const {
    return a.at > b.at;
  }
};
}  // namespace

void Worker::schedule(Clock::time_point at, std::shared_ptr<Connection> conn, std::uint64_t gen) {
  if (stopping_) return;
  heap_.push_back(Due{at, gen, std::move(conn)});
  std::push_heap(heap_.begin(), heap_.end(), Later{});
  if (!in_tick_ && at + kTickSlack < armed_) arm(at);
}

void Worker::arm(Clock::time_point at) {
  armed_ = at;
  tick_timer_.expires_at(at);
  tick_timer_.async_wait([this](error_code ec) {
    if (!ec && !stopping_) on_tick();
  });
}

void Worker::on_tick() {
  armed_ = Clock::time_point::max();
  in_tick_ = true;
  const auto now = Clock::now();
  const auto horizon = now + kTickSlack;
  while (!heap_.empty() && heap_.front().at <= horizon) {
    std::pop_heap(heap_.begin(), heap_.end(), Later{});
    Due d = std::move(heap_.back());
    heap_.pop_back();
    d.conn->on_due(d.gen, now);
  }
  in_tick_ = false;
  if (!heap_.empty()) arm(std::max(heap_.front().at, now + min_tick_));
}

}  // namespace weir::mock
