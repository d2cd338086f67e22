#include "gateway/worker.hpp"

#include <malloc.h>
#include <sys/socket.h>

#include <cerrno>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>

#include <boost/asio/post.hpp>
#include "http/probe.hpp"

#include "core/listen_probe.hpp"
#include "core/time.hpp"
#include "gateway/session.hpp"

namespace weir::gateway {

using boost::system::error_code;
using http::use_task;

Worker::Worker(Shared& shared, unsigned index)
    : shared_(shared),
      index_(index),
      // One thread runs this context and every I/O object stays on it; other
      // threads only post() to it, which stays locked.
      io_(BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO),
      acceptor_(io_.get_executor()),
      rng_(shared.instance_id ^ (0x9e3779b97f4a7c15ull * (index + 1))),
      metrics_(shared.metric_labels ? shared.metric_labels
                                    : MetricLabels::build(*shared.config, shared.auth_policy.get())),
      log_(shared.log_sink),
      record_queue_(shared.request_log ? &shared.request_log->queue(index) : nullptr),
      tick_(io_.get_executor()) {
  const auto& cfg = *shared.config;
  pools_.reserve(cfg.pools.size());
  for (std::size_t p = 0; p < cfg.pools.size(); ++p)
    pools_.emplace_back(cfg.pools[p], shared.endpoint_addrs[p],
                        p < shared.pool_states.size() ? shared.pool_states[p].get() : nullptr, index);
  batchers_.resize(cfg.pools.size());
  for (std::size_t p = 0; p < cfg.pools.size(); ++p) {
    if (!cfg.pools[p].batch.enabled() && !cfg.pools[p].coalesce) continue;
    batchers_[p] = std::make_unique<batching::MicroBatcher>(batching::BatchEnv{
        .ex = io_.get_executor(),
        .pool_cfg = &cfg.pools[p],
        .pool = &pools_[p],
        .rng = &rng_,
        .read_scratch = stream_read_,
        .body_scratch = stream_body_,
        .max_response_bytes = cfg.server.max_response_bytes,
        .api_key = cfg.pools[p].api_key,
        .next_request_id = [this](std::string& out) { next_request_id(out); },
        .stats = &metrics_.batch,
        .upstream_connects = &metrics_.upstream_connects,
        .on_attempt =
            [this, pool = static_cast<std::uint32_t>(p)](std::uint32_t ep, http::UpstreamFailure f) {
              metrics_.count_attempt(pool, ep);
              if (f != http::UpstreamFailure::none) metrics_.count_upstream_failure(pool, ep, f);
            },
    });
  }
  if (shared.auth_policy) {
    authn_ = std::make_unique<auth::Authenticator>(shared.auth_policy, shared.jwks, shared.redis_keys);
    admission_ = std::make_unique<admission::Admission>(*shared.limiter, shared.pricing, index);
  }
}

Worker::~Worker() { join(); }

MetricsShard Worker::metrics_snapshot() const {
  MetricsShard m = metrics_;
  for (std::size_t p = 0; p < pools_.size(); ++p) {
    const auto& pool = pools_[p];
    for (std::uint32_t i = 0; i < pool.size(); ++i)
      m.set_endpoint_health(static_cast<std::uint32_t>(p), i, pool.endpoint(i).opened, pool.endpoint(i).recovered);
    if (auto* q = pool.queue()) m.set_queue_waiting(static_cast<std::uint32_t>(p), q->waiting());
  }
  return m;
}

void Worker::dispatch_queues() {
  const auto now = core::now();
  for (auto& p : pools_) p.dispatch_queue(now);
}

std::string Worker::take_buffer() {
  if (spare_.empty()) return {};
  std::string s = std::move(spare_.back());
  spare_.pop_back();
  spare_bytes_ -= s.capacity();
  return s;
}

void Worker::give_buffer(std::string& s) {
  const std::size_t cap = s.capacity();
  if (cap > (1u << 16) || cap <= sizeof(std::string) || spare_bytes_ + cap > kSpareBytes) {
    std::string().swap(s);  // too big to keep, too small to be worth it, or enough spares
    return;
  }
  s.clear();
  spare_bytes_ += cap;
  spare_.push_back(std::move(s));
  s = std::string();  // moved-from: make its state explicit
}

std::uint16_t Worker::listen(const core::ListenAddress& addr, std::uint16_t port, bool exclusive, std::string& error) {
  error_code ec;
  auto ip = asio::ip::make_address(addr.host, ec);
  if (ec) {
    asio::ip::tcp::resolver resolver(io_);
    auto results = resolver.resolve(addr.host, "", ec);
    if (ec || results.empty()) {
      error = fmt::format("cannot resolve listen host {}: {}", addr.host, ec.message());
      return 0;
    }
    ip = results.begin()->endpoint().address();
  }
  const http::tcp::endpoint ep(ip, port);
  if (exclusive && core::probe_listen_address(ep) == EADDRINUSE) {
    error = fmt::format(
        "{} is already in use by another process (give --reuse-port or server.reuse_port: true to share it "
        "on purpose, e.g. for a zero-downtime restart)",
        core::format_address(ep));
    return 0;
  }
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) {
    // Every worker binds the same port; the kernel spreads connections.
    int one = 1;
    if (::setsockopt(acceptor_.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
      ec = error_code(errno, boost::system::system_category());
  }
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(4096, ec);
  if (ec) {
    error = fmt::format("cannot listen on {}:{}: {}", addr.host, port, ec.message());
    return 0;
  }
  return acceptor_.local_endpoint().port();
}

void Worker::start() {
  asio::co_spawn(io_.get_executor(), accept_loop(), asio::detached);
  asio::co_spawn(io_.get_executor(), tick_loop(), asio::detached);
  for (std::size_t p = 0; p < pools_.size(); ++p)
    if (pools_[p].config().health.enabled) asio::co_spawn(io_.get_executor(), probe_loop(p), asio::detached);
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        break;
      } catch (const std::exception& e) {
        // A bug escaped a session; keep serving the others.
        fmt::print(stderr, "weir: worker {}: unexpected exception: {}\n", index_, e.what());
      }
    }
    log_.flush();
  });
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::drain(std::chrono::steady_clock::time_point deadline) {
  asio::post(io_, [this, deadline] {
    if (draining_ && deadline >= drain_deadline_) return;
    draining_ = true;
    drain_deadline_ = deadline;
    error_code ignored;
    acceptor_.close(ignored);
    close_idle_sessions();
    tick_.cancel();  // re-evaluate now
  });
}

void Worker::close_idle_sessions() {
  for (Session* s = sessions_; s; s = s->next) s->close_if_idle();
}

void Worker::next_request_id(std::string& out) {
  out.clear();
  fmt::format_to(std::back_inserter(out), "{:08x}{:02x}{:010x}", static_cast<std::uint32_t>(shared_.instance_id),
                 index_ & 0xff, ++request_seq_);
}

void Worker::add_session(Session* s) {
  s->next = sessions_;
  s->prev = nullptr;
  if (sessions_) sessions_->prev = s;
  sessions_ = s;
  ++session_count_;
}

void Worker::remove_session(Session* s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    sessions_ = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = nullptr;
  --session_count_;
}

http::Task<void> Worker::accept_loop() {
  for (;;) {
    auto [ec, sock] = co_await acceptor_.async_accept(use_task);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      // Out of descriptors or memory: back off instead of spinning.
      http::Timer t(io_.get_executor());
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(use_task);
      continue;
    }
    auto s = std::make_unique<Session>(*this, std::move(sock));
    asio::co_spawn(io_.get_executor(), Session::run(std::move(s)), [this](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        fmt::print(stderr, "weir: worker {}: session failed: {}\n", index_, ex.what());
      }
    });
  }
}

void Worker::sweep_idle_upstreams() {
  const auto now = core::now();
  for (auto& p : pools_)
    for (std::uint32_t i = 0; i < p.size(); ++i) p.endpoint(i).conns.sweep(now);
}

void Worker::trim_when_idle() {
  // glibc keeps the heap a burst of connections grew (each worker thread has
  // its own arena) until something returns it: after kTrimAfterTicks with no
  // session on this worker, and only once per burst, malloc_trim(0) gives the
  // arenas' free pages back to the kernel (a few hundred µs for a heap of
  // ~100 MB; nothing is being served on this worker then).
  if (session_count_ > 0) {
    idle_ticks_ = 0;
    trimmed_ = false;
    return;
  }
  if (trimmed_ || ++idle_ticks_ < kTrimAfterTicks) return;
  trimmed_ = true;
  ::malloc_trim(0);
}

http::Task<void> Worker::probe_loop(std::size_t pool_index) {
  auto& pool = pools_[pool_index];
  const auto& hc = pool.config().health;
  http::Timer next(io_.get_executor());
  // Workers start their probes spread over the interval, not all at once.
  auto due = std::chrono::steady_clock::now() + hc.interval * (index_ + 1) / (shared_.workers.size() + 1);
  for (;;) {
    next.expires_at(due);
    co_await next.async_wait(use_task);
    if (draining_) co_return;
    due += hc.interval;
    for (std::uint32_t i = 0; i < pool.size(); ++i) {
      auto& ep = pool.endpoint(i);
      std::string tls_error;
      const http::ProbeRequest req{.addr = ep.addr,
                                   .host_header = ep.cfg->host_header,
                                   .path = hc.path,
                                   .timeout = hc.timeout,
                                   .tls = ep.tls,
                                   .api_key = pool.config().api_key,
                                   .tls_error = &tls_error};
      const bool ok = co_await http::probe_health(io_.get_executor(), req);
      // A failed handshake or certificate check says why (at most every 10 s per endpoint).
      if (!ok && !tls_error.empty()) routing::log_tls_failure(ep, pool.config().name, tls_error, core::now());
      if (pool.report_probe(i, ok, std::chrono::steady_clock::now())) {
        ++metrics_.health_transitions;
        fmt::print(stderr, "weir: worker {}: pool {} endpoint {} is {} (GET {}{}{})\n", index_, pool.config().name,
                   ep.cfg->display, ok ? "healthy again" : "unhealthy", hc.path,
                   tls_error.empty() ? "" : ": TLS: ", tls_error);
      }
    }
  }
}

http::Task<void> Worker::tick_loop() {
  // Flushes the access log every 50 ms, sweeps the idle upstream connections
  // every kSweepTicks ticks, and drives the drain.
  for (unsigned tick = 1;; ++tick) {
    tick_.expires_after(std::chrono::milliseconds(50));
    co_await tick_.async_wait(use_task);
    log_.flush();
    dispatch_queues();
    if (tick % kSweepTicks == 0) sweep_idle_upstreams();
    trim_when_idle();
    if (!draining_) continue;
    close_idle_sessions();
    if (std::chrono::steady_clock::now() >= drain_deadline_)
      for (Session* s = sessions_; s; s = s->next) s->force_close();
    if (session_count_ == 0) {
      for (auto& p : pools_)
        for (std::uint32_t i = 0; i < p.size(); ++i) p.endpoint(i).conns.clear();
      log_.flush();
      io_.stop();
      co_return;
    }
  }
}

}  // namespace weir::gateway
