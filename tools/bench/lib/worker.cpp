// The network side of weir-bench: a keep-alive HTTP/1.1 connection pool
// driven by the pacer (open loop) or by completions (closed loop).
//
// Per request the steady state is one send() (the request is written
// synchronously on the non-blocking socket: it fits the send buffer), one
// recv() per arrival, and the epoll_wait()/timerfd work shared with every
// other connection. async_read_some is used rather than readiness waits:
// Asio re-arms the descriptor with epoll_ctl on every async_wait, while a
// read that found the socket drained makes the next async_read_some queue
// without any syscall. Each connection owns a small read buffer (grown only
// for an oversized header or chunk line) and feeds Beast's parser in place.
#include "bench/lib/worker.hpp"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>

#include "bench/lib/schedule.hpp"
#include "bench/lib/sse.hpp"

namespace weir::bench {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
// Concrete executor types: any_io_executor copies show up in Asio profiles.
using Executor = asio::io_context::executor_type;
using Socket = asio::basic_stream_socket<tcp, Executor>;
using Timer =
    asio::basic_waitable_timer<std::chrono::steady_clock, asio::wait_traits<std::chrono::steady_clock>, Executor>;

std::atomic<bool> g_stop{false};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

constexpr std::size_t kReadBuffer = 4 * 1024;      // per connection
constexpr std::size_t kMaxReadBuffer = 64 * 1024;  // header or chunk line limit
constexpr std::size_t kMaxKeptBody = 256 * 1024;   // non-SSE body kept for the usage scan
constexpr std::uint64_t kMaxConnecting = 64;       // connects in flight per worker

// Seconds this thread has spent runnable but waiting for a CPU (Linux
// schedstat); < 0 if unavailable. A generator starved by other processes
// shows it here rather than as a mystery in its latencies.
double thread_runqueue_wait_seconds() {
  std::FILE* f = std::fopen("/proc/thread-self/schedstat", "r");
  if (!f) return -1;
  unsigned long long run_ns = 0, wait_ns = 0;
  const int n = std::fscanf(f, "%llu %llu", &run_ns, &wait_ns);
  std::fclose(f);
  return n == 2 ? static_cast<double>(wait_ns) / 1e9 : -1;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Connect failures that are the generator's own resource limits, not the target's.
bool is_generator_limit(const error_code& ec) {
  if (ec.category() != boost::system::system_category()) return false;
  const int v = ec.value();
  return v == EMFILE || v == ENFILE || v == ENOBUFS || v == ENOMEM || v == EADDRNOTAVAIL;
}

bool iequals_prefix(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != prefix[i]) return false;
  }
  return true;
}

struct Req {
  std::int64_t intended_ns = 0;
  std::int64_t sent_ns = 0;   // written to the socket (start_request)
  std::int64_t mock_ns = -1;  // a non-streamed body's "mock_ns" (weir-mock --stamp), -1 if absent
  std::uint32_t payload = 0;
  bool measured = false;
  bool retried = false;
  bool leave = false;  // leaves mid-stream (--leave)
};

struct Conn;

// Beast's parser with callbacks straight into the connection: no body
// storage, SSE bytes go to the StreamTracker as they are decoded.
using bsv = boost::beast::string_view;  // boost::core::string_view in Beast 1.81

class ResponseParser final : public http::basic_parser<false> {
 public:
  explicit ResponseParser(Conn& c) : conn_(c) {}

 private:
  void on_request_impl(http::verb, bsv, bsv, int, error_code&) override {}
  void on_response_impl(int code, bsv, int, error_code&) override;
  void on_field_impl(http::field name, bsv, bsv value, error_code&) override;
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(boost::optional<std::uint64_t> const&, error_code&) override {}
  std::size_t on_body_impl(bsv body, error_code&) override;
  void on_chunk_header_impl(std::uint64_t, bsv, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, bsv body, error_code&) override;
  void on_finish_impl(error_code&) override {}

  Conn& conn_;
};

enum class St : std::uint8_t { closed, connecting, idle, busy };

struct Conn {
  explicit Conn(asio::io_context& ioc) : sock(ioc.get_executor()) {}

  Socket sock;
  St st = St::closed;
  std::uint32_t gen = 0;   // bumped on close: stale handlers compare and return
  bool in_idle = false;    // listed in the worker's idle vector
  bool reused = false;     // this TCP connection already carried a response
  bool got_bytes = false;  // the current request received at least one byte
  bool sse = false;        // the current response is text/event-stream
  int status = 0;
  Req req;
  std::int64_t deadline_ns = 0;  // timeout of the current request or connect
  std::int64_t connect_start_ns = 0;
  std::int64_t feed_ns = 0;  // arrival time of the bytes being parsed
  std::optional<ResponseParser> parser;
  std::vector<char> buf;  // read buffer; [0, buf_len) is an unparsed tail
  std::size_t buf_len = 0;
  std::string body;  // non-SSE body, capped at kMaxKeptBody
  StreamTracker tracker;
};

void ResponseParser::on_response_impl(int code, bsv, int, error_code&) { conn_.status = code; }

void ResponseParser::on_field_impl(http::field name, bsv, bsv value, error_code&) {
  if (name == http::field::content_type) {
    conn_.sse = iequals_prefix(std::string_view(value.data(), value.size()), "text/event-stream");
  }
}

std::size_t ResponseParser::on_body_impl(bsv b, error_code&) {
  const std::string_view body(b.data(), b.size());
  if (conn_.sse) {
    conn_.tracker.feed(body, conn_.feed_ns);
  } else if (conn_.body.size() < kMaxKeptBody) {
    conn_.body.append(body.substr(0, kMaxKeptBody - conn_.body.size()));
  }
  return body.size();
}

std::size_t ResponseParser::on_chunk_body_impl(std::uint64_t, bsv body, error_code& ec) {
  return on_body_impl(body, ec);
}

}  // namespace

struct Worker::Impl {
  Impl(const Plan& p, std::uint32_t index)
      : plan(p), index(index), pacer_timer(ioc.get_executor()), sweep_timer(ioc.get_executor()) {
    const std::uint32_t n = plan.threads;
    cap = std::max<std::uint64_t>(1, plan.connections / n + (index < plan.connections % n ? 1 : 0));
    if (plan.open_loop) {
      Schedule sched(plan.poisson ? Arrivals::poisson : Arrivals::constant, plan.rate, n, index, plan.seed);
      pacer.emplace(std::move(sched), plan.start_ns, plan.end_ns);
    } else {
      users = plan.concurrency / n + (index < plan.concurrency % n ? 1 : 0);
    }
    next_payload = index;
    leave_state = plan.seed * 0x9e3779b97f4a7c15ull + index + 1;
  }

  // ---- configuration and state ----
  const Plan& plan;
  std::uint32_t index;
  asio::io_context ioc{1};
  Timer pacer_timer;
  Timer sweep_timer;
  std::optional<Pacer> pacer;
  std::uint32_t users = 0;  // closed loop: this worker's share of --concurrency
  std::uint64_t cap = 1;    // this worker's share of --connections
  std::uint64_t next_payload = 0;
  std::uint64_t leave_state = 0;  // splitmix64 state of the --leave draws

  std::vector<std::unique_ptr<Conn>> conns;  // every connection object ever made (stable)
  std::vector<Conn*> idle;                   // open, no request
  std::vector<Conn*> spare;                  // closed objects for reuse
  std::deque<Req> pending;                   // released, waiting for a connection
  std::uint64_t open = 0;                    // connected sockets
  std::uint64_t connecting = 0;
  std::uint64_t busy = 0;
  bool sending_done = false;  // no more requests will be issued
  bool stopping = false;      // SIGINT
  bool finished = false;
  std::uint64_t to_issue = 0;  // closed loop: next requests posted, not yet issued

  Stats stats;
  Live live;

  // ---- helpers ----
  static Timer::time_point tp(std::int64_t ns) { return Timer::time_point(std::chrono::nanoseconds(ns)); }

  bool in_window(std::int64_t t) const { return t >= plan.measure_start_ns && t < plan.end_ns; }

  void publish() {
    live.inflight.store(busy + pending.size(), std::memory_order_relaxed);
    live.open_connections.store(open, std::memory_order_relaxed);
  }

  // Uniform in [0, 1) (splitmix64): whether a request leaves mid-stream.
  double next_unit() {
    std::uint64_t z = (leave_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

  std::uint32_t take_payload() {
    const auto i = static_cast<std::uint32_t>(next_payload % plan.requests.size());
    next_payload += plan.threads;  // threads interleave over the payload list
    return i;
  }

  // ---- run ----
  void run() {
    const double cpu0 = thread_cpu_seconds();
    const double wait0 = thread_runqueue_wait_seconds();
    const std::int64_t wall0 = now_ns();
    if (plan.open_loop) {
      arm_pacer();
    } else {
      pacer_timer.expires_at(tp(plan.start_ns));
      pacer_timer.async_wait([this](error_code ec) {
        if (ec) return;
        const std::int64_t now = now_ns();
        for (std::uint32_t i = 0; i < users; ++i) issue(now, 0);
      });
    }
    arm_sweep();
    ioc.run();
    const double cpu = thread_cpu_seconds() - cpu0;
    const double wall = static_cast<double>(now_ns() - wall0) / 1e9;
    stats.cpu_seconds = cpu;
    const double wait1 = thread_runqueue_wait_seconds();
    if (wait0 >= 0 && wait1 >= 0) {
      stats.runqueue_wait_seconds = wait1 - wait0;
      stats.max_thread_runqueue_wait = wall > 0 ? (wait1 - wait0) / wall : 0;
    }
    stats.max_thread_cpu_util = wall > 0 ? cpu / wall : 0;
    publish();
    live.finished.store(true, std::memory_order_release);
  }

  // ---- open loop: pacer ----
  void arm_pacer() {
    const auto t = pacer->next_due();
    if (!t) {
      sending_done = true;
      maybe_finish();
      return;
    }
    pacer_timer.expires_at(tp(*t));
    pacer_timer.async_wait([this](error_code ec) {
      if (!ec) on_pacer();
    });
  }

  void on_pacer() {
    if (stopping) return;
    // Release everything due, but yield to I/O after a batch so a generator
    // that fell behind still reads responses (their lateness is recorded).
    for (int n = 0; n < 512; ++n) {
      const std::int64_t now = now_ns();
      const auto d = pacer->poll(now);
      if (!d) {
        arm_pacer();
        return;
      }
      issue(d->intended_ns, d->lateness_ns);
    }
    asio::post(ioc, [this] { on_pacer(); });
  }

  // A new request intended at `intended` (released `lateness` ns late).
  void issue(std::int64_t intended, std::int64_t lateness) {
    Req r;
    r.intended_ns = intended;
    r.payload = take_payload();
    r.measured = intended >= plan.measure_start_ns;
    r.leave = plan.leave_fraction > 0 && next_unit() < plan.leave_fraction;
    ++stats.requests_total;
    if (r.measured) {
      ++stats.scheduled;
      if (in_window(now_ns())) ++stats.released_in_window;
      if (plan.open_loop) stats.sender_lag.record(lateness);
    } else {
      ++stats.warmup_requests;
    }
    dispatch(r);
  }

  // ---- pool ----
  void dispatch(const Req& r) {
    if (!idle.empty()) {
      Conn* c = idle.back();
      idle.pop_back();
      c->in_idle = false;
      start_request(*c, r);
      return;
    }
    pending.push_back(r);
    open_more();
    if (pending.size() > connecting && open + connecting >= cap) ++stats.pool_cap_waits;
    publish();
  }

  // Opens connections until every pending request has one on the way, up to
  // the cap, with at most kMaxConnecting connects in flight: a burst of sends
  // (a late pacer) is served by the connections that free up first instead of
  // opening hundreds of sockets at once, which would make the generator (and
  // the target's accept queue) slower still.
  void open_more() {
    // A failed open() fails one queued request, so this loop ends.
    while (connecting < pending.size() && connecting < kMaxConnecting && open + connecting < cap) {
      open_conn();
    }
  }

  // Starts one connect; false if the socket could not even be opened (the
  // oldest queued request then fails as a connect error).
  bool open_conn() {
    Conn* c;
    if (!spare.empty()) {
      c = spare.back();
      spare.pop_back();
    } else {
      conns.push_back(std::make_unique<Conn>(ioc));
      c = conns.back().get();
      c->buf.resize(kReadBuffer);
    }
    error_code ec;
    c->sock.open(plan.endpoint.protocol(), ec);
    if (ec) {
      spare.push_back(c);
      fail_pending_connect(ec);
      return false;
    }
    c->st = St::connecting;
    c->reused = false;
    c->connect_start_ns = now_ns();
    c->deadline_ns = c->connect_start_ns + plan.timeout_ns;
    ++connecting;
    c->sock.async_connect(plan.endpoint, [this, c, g = c->gen](error_code ec) {
      if (g != c->gen) return;
      on_connected(*c, ec);
    });
    return true;
  }

  // A connect failed: the oldest pending request fails with it (so a dead
  // target turns every request into one connect error, as it should).
  void fail_pending_connect(const error_code& ec) {
    if (is_generator_limit(ec)) ++stats.connect_generator;  // counted per attempt
    if (pending.empty()) return;
    const Req r = pending.front();
    pending.pop_front();
    record_failure(r, Outcome::connect, now_ns());
  }

  void on_connected(Conn& c, const error_code& ec) {
    --connecting;
    if (ec) {
      close_conn(c);
      fail_pending_connect(ec);
      if (!stopping) open_more();
      maybe_finish();
      publish();
      return;
    }
    const std::int64_t now = now_ns();
    stats.connect.record(now - c.connect_start_ns);
    ++stats.connections_opened;
    ++open;
    stats.max_open_connections = std::max(stats.max_open_connections, open);
    error_code ignored;
    c.sock.set_option(tcp::no_delay(true), ignored);
    c.sock.non_blocking(true, ignored);
    c.st = St::idle;
    ready(c);
    if (!stopping) open_more();  // connects were capped at kMaxConnecting: queue may want more
  }

  // The connection is free: take the next pending request or go idle.
  void ready(Conn& c) {
    if (!pending.empty()) {
      const Req r = pending.front();
      pending.pop_front();
      start_request(c, r);
    } else if (sending_done || stopping) {
      close_conn(c);
      maybe_finish();
    } else {
      c.st = St::idle;
      c.in_idle = true;
      idle.push_back(&c);
    }
    publish();
  }

  void close_conn(Conn& c) {
    if (c.st == St::closed) return;
    if (c.in_idle) {
      idle.erase(std::remove(idle.begin(), idle.end(), &c), idle.end());
      c.in_idle = false;
    }
    if (c.st == St::idle || c.st == St::busy) --open;
    if (c.st == St::busy) --busy;
    error_code ignored;
    c.sock.close(ignored);
    ++c.gen;
    c.st = St::closed;
    c.parser.reset();
    c.buf_len = 0;
    spare.push_back(&c);
  }

  // ---- one request ----
  void start_request(Conn& c, const Req& r) {
    c.st = St::busy;
    ++busy;
    stats.max_busy = std::max(stats.max_busy, busy);
    c.req = r;
    c.req.sent_ns = now_ns();
    c.got_bytes = false;
    c.sse = false;
    c.status = 0;
    c.buf_len = 0;
    c.body.clear();
    c.parser.emplace(c);
    c.parser->eager(true);
    c.parser->body_limit(boost::none);
    c.tracker.start(r.measured ? &stats.itl : nullptr, plan.stall_ns);
    const std::int64_t now = now_ns();
    c.deadline_ns = now + plan.timeout_ns;
    if (r.measured && !r.retried) ++stats.sent;
    live.sent.fetch_add(1, std::memory_order_relaxed);

    const std::string& msg = plan.requests[r.payload];
    error_code ec;
    const std::size_t n = c.sock.write_some(asio::buffer(msg), ec);
    if (!ec && n == msg.size()) {
      start_read(c);
      return;
    }
    if (ec && ec != asio::error::would_block) {
      on_io_error(c, ec);
      return;
    }
    // The send buffer was full: finish the write asynchronously, then read.
    const std::size_t off = ec ? 0 : n;
    asio::async_write(c.sock, asio::buffer(msg.data() + off, msg.size() - off),
                      [this, &c, g = c.gen](error_code ec, std::size_t) {
                        if (g != c.gen) return;
                        if (ec) {
                          on_io_error(c, ec);
                        } else {
                          start_read(c);
                        }
                      });
  }

  void start_read(Conn& c) {
    c.sock.async_read_some(asio::buffer(c.buf.data() + c.buf_len, c.buf.size() - c.buf_len),
                           [this, &c, g = c.gen](error_code ec, std::size_t n) {
                             if (g != c.gen) return;
                             on_read(c, ec, n);
                           });
  }

  void on_read(Conn& c, const error_code& ec, std::size_t n) {
    if (ec == asio::error::eof) {
      on_eof(c);
      return;
    }
    if (ec) {
      on_io_error(c, ec);
      return;
    }
    c.got_bytes = true;
    stats.bytes_received += n;
    c.feed_ns = now_ns();
    const int r = feed(c, c.buf_len + n);
    if (r > 0) {
      finish(c);
    } else if (r < 0) {
      fail_and_close(c, Outcome::protocol);
    } else if (c.req.leave && c.sse && c.tracker.stats().events >= plan.leave_after) {
      fail_and_close(c, Outcome::left);  // the client goes away mid-stream
    } else {
      start_read(c);
    }
  }

  // Parses the first `len` bytes of c.buf; keeps the unparsed tail at its
  // front. Returns 1 when the response is complete, 0 for more, -1 on error.
  int feed(Conn& c, std::size_t len) {
    const char* p = c.buf.data();
    while (len > 0) {
      error_code ec;
      const std::size_t used = c.parser->put(asio::const_buffer(p, len), ec);
      p += used;
      len -= used;
      if (ec == http::error::need_more) break;
      if (ec) return -1;
      if (c.parser->is_done()) return 1;  // bytes after a response: none expected, dropped
      if (used == 0) break;
    }
    if (len > 0 && p != c.buf.data()) std::memmove(c.buf.data(), p, len);
    c.buf_len = len;
    if (len == c.buf.size()) {  // a header or chunk line longer than the buffer
      if (c.buf.size() >= kMaxReadBuffer) return -1;
      c.buf.resize(c.buf.size() * 2);
    }
    return 0;
  }

  void on_eof(Conn& c) {
    if (c.parser && c.parser->is_header_done() && c.parser->need_eof()) {
      error_code ec;
      c.parser->put_eof(ec);
      if (!ec && c.parser->is_done()) {
        finish(c, /*close_after=*/true);
        return;
      }
    }
    on_io_error(c, asio::error::eof);
  }

  void on_io_error(Conn& c, const error_code& ec) {
    if (ec == asio::error::operation_aborted) return;  // closed by us
    // A keep-alive connection the server closed while idle: send again, once,
    // on a fresh connection (as HTTP clients do; RFC 9112 §9.3.1).
    if (!c.got_bytes && c.reused && !c.req.retried && !stopping) {
      Req r = c.req;
      r.retried = true;
      ++stats.reconnects;
      close_conn(c);
      pending.push_front(r);
      open_more();
      publish();
      return;
    }
    Outcome o = Outcome::io;
    if (c.sse && c.parser && c.parser->is_header_done()) o = Outcome::truncated;
    fail_and_close(c, o);
  }

  void fail_and_close(Conn& c, Outcome o) {
    const Req r = c.req;
    const bool has_stream = c.sse;
    close_conn(c);
    record_done(r, o, now_ns(), has_stream ? &c.tracker.stats() : nullptr);
    if (!stopping) open_more();  // the closed connection's slot may serve a queued request
    after_request();
  }

  // A complete HTTP response.
  void finish(Conn& c, bool close_after = false) {
    const std::int64_t now = now_ns();
    Outcome o = Outcome::ok;
    if (c.status < 200 || c.status >= 300) {
      o = Outcome::status;
      if (c.req.measured && c.status >= 0 && c.status < 600) ++stats.status_codes[c.status];
    } else if (c.sse) {
      const auto& s = c.tracker.stats();
      if (s.stream_error)
        o = Outcome::stream_error;
      else if (!s.done)
        o = Outcome::truncated;
      else if (s.stalled)
        o = Outcome::stall;
    }
    const bool keep = !close_after && c.parser->keep_alive();
    if (c.sse) {
      record_done(c.req, o, now, &c.tracker.stats());
    } else {
      const JsonScan scan = c.req.measured && o == Outcome::ok ? scan_json(c.body) : JsonScan{};
      c.req.mock_ns = scan.mock_ns;
      record_done(c.req, o, now, nullptr);
      if (c.req.measured && o == Outcome::ok) {
        if (scan.completion_tokens >= 0) {
          stats.tokens += static_cast<std::uint64_t>(scan.completion_tokens);
          stats.usage_completion_tokens += static_cast<std::uint64_t>(scan.completion_tokens);
          ++stats.with_usage;
        }
        if (scan.prompt_tokens >= 0) {
          stats.usage_prompt_tokens += static_cast<std::uint64_t>(scan.prompt_tokens);
        }
      }
    }
    c.parser.reset();
    c.reused = true;
    if (keep) {
      --busy;
      c.st = St::idle;
      ready(c);
    } else {
      close_conn(c);
      if (!stopping) open_more();
    }
    after_request();
  }

  void record_failure(const Req& r, Outcome o, std::int64_t now) {
    record_done(r, o, now, nullptr);
    after_request();
  }

  void record_done(const Req& r, Outcome o, std::int64_t now, const StreamStats* s) {
    live.completed.fetch_add(1, std::memory_order_relaxed);
    if (o == Outcome::ok) live.ok.fetch_add(1, std::memory_order_relaxed);
    if (s) stats.events_total += s->events;
    if (!r.measured) return;
    ++stats.completed;
    ++stats.outcomes[static_cast<std::size_t>(o)];
    const bool answered = o == Outcome::ok || o == Outcome::stall;
    if (answered) stats.e2e.record(now - r.intended_ns);
    if (answered && !s && r.mock_ns >= 0)
      stats.record_hop(r.sent_ns - plan.measure_start_ns, std::max<std::int64_t>(0, now - r.sent_ns - r.mock_ns));
    if (s) {
      if (s->first_token_ns >= 0) stats.ttft.record(s->first_token_ns - r.intended_ns);
      if (answered && s->first_token_ns >= 0 && s->first_token_mock_ns >= 0)
        stats.record_hop(r.sent_ns - plan.measure_start_ns,
                         std::max<std::int64_t>(0, s->first_token_ns - r.sent_ns - s->first_token_mock_ns));
      stats.tokens += s->tokens;
      stats.events += s->events;
      live.tokens.fetch_add(s->tokens, std::memory_order_relaxed);
      if (s->usage_completion_tokens >= 0) {
        stats.usage_completion_tokens += static_cast<std::uint64_t>(s->usage_completion_tokens);
        ++stats.with_usage;
      }
      if (s->usage_prompt_tokens >= 0) {
        stats.usage_prompt_tokens += static_cast<std::uint64_t>(s->usage_prompt_tokens);
      }
    }
  }

  // Closed loop: every finished request starts the next one while the run lasts.
  // Posted, not called: a failure inside dispatch (EMFILE on open) must not recurse.
  void after_request() {
    if (!plan.open_loop && !stopping) {
      if (now_ns() < plan.end_ns) {
        ++to_issue;
        asio::post(ioc, [this] {
          --to_issue;
          if (!stopping && !sending_done) issue(now_ns(), 0);
          maybe_finish();
        });
      } else {
        sending_done = true;
      }
    }
    publish();
    maybe_finish();
  }

  // ---- timeouts, interruption, end ----
  void arm_sweep() {
    const std::int64_t tick = std::clamp<std::int64_t>(plan.timeout_ns / 20, 10'000'000, 100'000'000);
    sweep_timer.expires_after(std::chrono::nanoseconds(tick));
    sweep_timer.async_wait([this](error_code ec) {
      if (ec) return;
      sweep();
      if (!finished) arm_sweep();
    });
  }

  void sweep() {
    const std::int64_t now = now_ns();
    if (g_stop.load(std::memory_order_relaxed) && !stopping) interrupt();
    if (!plan.open_loop && now >= plan.end_ns) sending_done = true;
    for (std::size_t i = 0; i < conns.size(); ++i) {  // by index: open_more() may append
      Conn& c = *conns[i];
      if (c.st == St::busy && now > c.deadline_ns) {
        fail_and_close(c, Outcome::timeout);
      } else if (c.st == St::connecting && now > c.deadline_ns) {
        --connecting;
        close_conn(c);
        fail_pending_connect(asio::error::timed_out);
        if (!stopping) open_more();
      }
    }
    publish();
    maybe_finish();
  }

  void interrupt() {
    stopping = true;
    sending_done = true;
    if (pacer) pacer->stop();
    pacer_timer.cancel();
    const std::int64_t now = now_ns();
    while (!pending.empty()) {
      const Req r = pending.front();
      pending.pop_front();
      record_done(r, Outcome::cancelled, now, nullptr);
    }
    for (std::size_t i = 0; i < conns.size(); ++i) {
      Conn& c = *conns[i];
      if (c.st == St::busy) {
        const Req r = c.req;
        const bool has_stream = c.sse;
        close_conn(c);  // keeps the tracker's numbers
        record_done(r, Outcome::cancelled, now, has_stream ? &c.tracker.stats() : nullptr);
      } else if (c.st == St::connecting) {
        --connecting;
        close_conn(c);
      }
    }
  }

  void maybe_finish() {
    if (finished || !sending_done || busy > 0 || !pending.empty() || to_issue > 0) return;
    if (plan.open_loop && pacer && !pacer->done() && !stopping) return;
    finished = true;
    for (auto& up : conns) {
      if (up->st == St::connecting) --connecting;
      close_conn(*up);
    }
    pacer_timer.cancel();
    sweep_timer.cancel();
  }
};

Worker::Worker(const Plan& plan, std::uint32_t index) : impl_(std::make_unique<Impl>(plan, index)) {}
Worker::~Worker() = default;
void Worker::run() { impl_->run(); }
Stats& Worker::stats() { return impl_->stats; }
Live& Worker::live() { return impl_->live; }

}  // namespace weir::bench
