#include "gateway/worker.hpp"

#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <openssl/rand.h>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>

#include <boost/asio/post.hpp>
#include "http/probe.hpp"

#include "core/keep_running.hpp"
#include "core/listen_probe.hpp"
#include "core/note.hpp"
#include "core/time.hpp"
#include "gateway/host_rule.hpp"
#include "gateway/session.hpp"

namespace weir::gateway {

using boost::system::error_code;
using http::use_task;

namespace {
// Admission's default prices: never used (every admit passes its generation's).
const admission::Pricing kNoPrices;
}  // namespace

Worker::Worker(Shared& shared, unsigned index)
    : shared_(shared),
      index_(index),
      // One thread runs this context and every I/O object stays on it; other
      // threads only post() to it, which stays locked.
      io_(BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO),
      acceptor_(io_.get_executor()),
      rng_(shared.instance_id ^ (0x9e3779b97f4a7c15ull * (index + 1))),
      metrics_(shared.generation->labels),
      log_(shared.log_sink),
      record_queue_(shared.request_log ? &shared.request_log->queue(index) : nullptr),
      trace_queue_(shared.tracer ? &shared.tracer->queue(index) : nullptr),
      accept_log_(fmt::format("worker {}: cannot accept connections on the client port", index),
                  "new connections wait in the listen backlog until descriptors are free (weir_accept_errors_total)"),
      probe_log_(fmt::format("worker {}: cannot open a socket for health probes", index),
                 "probes are skipped and no endpoint's state changes (weir_local_resource_failures_total)"),
      tick_(io_.get_executor()) {
  gen_ = make_generation(shared.generation, nullptr);
  if (shared.auth_policy) {
    authn_ = std::make_unique<auth::Authenticator>(shared.auth_policy, shared.jwks, shared.redis_keys);
    admission_ = std::make_unique<admission::Admission>(*shared.limiter, kNoPrices, index);
  }
}

std::shared_ptr<WorkerGeneration> Worker::make_generation(std::shared_ptr<const Generation> g,
                                                          WorkerGeneration* current) {
  auto wg = std::make_shared<WorkerGeneration>();
  wg->shared = std::move(g);
  const Generation& gen = *wg->shared;
  const auto& cfg = *gen.config;
  for (std::size_t p = 0; p < gen.pools.size(); ++p) {
    const PoolSlot& slot = gen.pools[p];
    std::shared_ptr<routing::WorkerPool> pool;
    std::shared_ptr<batching::MicroBatcher> batcher;
    routing::WorkerPool* before = nullptr;  // the pool of that name the current generation has
    if (current) {
      for (std::size_t q = 0; q < current->shared->pools.size(); ++q) {
        if (current->shared->pools[q].cfg->name != slot.cfg->name) continue;
        if (current->shared->pools[q].state == slot.state) {  // unchanged: the same objects go on
          pool = current->pools[q];
          batcher = current->batchers[q];
        } else {
          before = current->pools[q].get();
        }
      }
    }
    if (!pool) {
      pool = std::make_shared<routing::WorkerPool>(*slot.cfg, slot.addrs, slot.state.get(), index_,
                                                   std::make_shared<PoolSlot>(slot));
      if (before) pool->carry_from(*before);
      const auto& pc = *slot.cfg;
      {
        // Its endpoints' openings and recoveries count into their series (slots fixed for this pool object).
        std::vector<std::size_t> slots;
        for (std::uint32_t e = 0; e < pc.endpoints.size(); ++e)
          slots.push_back(gen.labels->endpoint_slot(static_cast<std::uint32_t>(p), e));
        pool->on_transition(
            [this, slots = std::move(slots)](std::uint32_t ep, routing::Transition t, routing::OpenCause cause) {
              const std::size_t slot = ep < slots.size() ? slots[ep] : SIZE_MAX;
              if (t == routing::Transition::opened)
                metrics_.count_ejection_at(slot, cause);
              else if (t == routing::Transition::closed)
                metrics_.count_recovery_at(slot);
            });
      }
      if (pc.batch.enabled() || pc.coalesce) {
        // A batch's attempts count into its endpoints' series: their slots
        // are fixed now (they never change for this pool object).
        std::vector<std::size_t> slots;
        for (std::uint32_t e = 0; e < pc.endpoints.size(); ++e)
          slots.push_back(gen.labels->endpoint_slot(static_cast<std::uint32_t>(p), e));
        batcher = std::make_shared<batching::MicroBatcher>(batching::BatchEnv{
            .ex = io_.get_executor(),
            .pool_cfg = &pc,
            .pool = pool.get(),
            .rng = &rng_,
            .read_scratch = stream_read_,
            .body_scratch = stream_body_,
            .max_response_bytes = cfg.server.max_response_bytes,
            .upstream_lines = pc.upstream_lines,
            .next_request_id = [this](std::string& out) { next_request_id(out); },
            .stats = &metrics_.batch,
            .upstream_connects = &metrics_.upstream_connects,
            .on_attempt =
                [this, slots = std::move(slots)](std::uint32_t ep, http::UpstreamFailure f) {
                  const std::size_t slot = ep < slots.size() ? slots[ep] : SIZE_MAX;
                  metrics_.count_attempt_at(slot);
                  if (f != http::UpstreamFailure::none) metrics_.count_upstream_failure_at(slot, f);
                },
            .on_retry = [this](routing::RetryReason r) { metrics_.count_retry(r); },
            .on_pick = [this](routing::PickRule r) { metrics_.count_pick(r); },
        });
      }
    }
    wg->pools.push_back(std::move(pool));
    wg->batchers.push_back(std::move(batcher));
  }
  return wg;
}

void Worker::post_install(std::shared_ptr<const Generation> next, std::shared_ptr<const auth::AuthPolicy> policy,
                          std::function<void()> done) {
  asio::post(io_, [this, next = std::move(next), policy = std::move(policy), done = std::move(done)]() mutable {
    install(std::move(next), std::move(policy));
    done();
  });
}

void Worker::install(std::shared_ptr<const Generation> next, std::shared_ptr<const auth::AuthPolicy> policy) {
  if (next && next != gen_->shared) {
    auto wg = make_generation(std::move(next), gen_.get());
    metrics_.relabel(wg->shared->labels);
    // The old generation's pools that the new one does not keep: their idle
    // connections close now; a request still on them returns its
    // connection there, and it closes when the generation is freed.
    for (auto& p : gen_->pools) {
      bool kept = false;
      for (auto& q : wg->pools) kept = kept || q == p;
      if (!kept)
        for (std::uint32_t i = 0; i < p->size(); ++i) p->endpoint(i).conns.clear();
    }
    if (!draining_) start_probes(*wg, gen_.get());
    retired_.push_back(std::move(gen_));
    gen_ = std::move(wg);
    wake_tick();  // the retired generation is freed by the tick
  }
  if (policy && authn_) authn_->set_policy(std::move(policy));
}

void Worker::free_retired() {
  // No request holds it any more, and no batch runs on a micro-batcher of its that
  // the current generation does not have (a kept one lives on with it).
  std::erase_if(retired_, [this](const std::shared_ptr<WorkerGeneration>& g) {
    if (g.use_count() != 1) return false;
    for (std::size_t p = 0; p < g->batchers.size(); ++p) {
      const auto& b = g->batchers[p];
      if (!b || b->idle()) continue;
      bool kept = false;
      for (const auto& c : gen_->batchers) kept = kept || c == b;
      if (!kept) return false;
    }
    return true;
  });
}

void Worker::start_probes(const WorkerGeneration& g, const WorkerGeneration* before) {
  for (const auto& p : g.pools) {
    if (!p->config().health.enabled) continue;
    bool running = false;  // an unchanged pool's loop goes on
    if (before)
      for (const auto& q : before->pools) running = running || q == p;
    if (!running) asio::co_spawn(io_.get_executor(), probe_pool(p), asio::detached);
  }
}

Worker::~Worker() { join(); }

template <typename F>
void Worker::for_each_pool(F&& f) {
  // The current generation's pools, then the retired ones' that it does not
  // have (their requests still queue and finish there); each object once.
  // (Every tick: the list of those seen is a reused member, no allocation.)
  auto& seen = pools_seen_;
  seen.clear();
  auto visit = [&](WorkerGeneration& g) {
    for (std::size_t p = 0; p < g.pools.size(); ++p) {
      routing::WorkerPool* pool = g.pools[p].get();
      if (std::find(seen.begin(), seen.end(), pool) != seen.end()) continue;
      seen.push_back(pool);
      f(g, static_cast<std::uint32_t>(p), *pool);
    }
  };
  visit(*gen_);
  for (auto& g : retired_) visit(*g);
}

MetricsShard Worker::metrics_snapshot() {
  MetricsShard m = metrics_;
  for_each_pool([&](WorkerGeneration& g, std::uint32_t p, routing::WorkerPool& pool) {
    if (const auto* q = pool.queue()) m.add_queue_waiting(g.labels().pool_slot_of(p), q->waiting());
  });
  return m;
}

void Worker::dispatch_queues() {
  const auto now = core::now();
  for_each_pool([&](WorkerGeneration&, std::uint32_t, routing::WorkerPool& pool) { pool.dispatch_queue(now); });
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
  auto ip = core::resolve_listen_host(addr.host);
  if (!ip) {
    error = std::move(ip.error());
    return 0;
  }
  const http::tcp::endpoint ep(*ip, port);
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
    error = fmt::format("cannot listen on {}: {}", core::format_host_port(addr.host, port), ec.message());
    return 0;
  }
  loopback_listener_ = is_loopback(ep.address());
  return acceptor_.local_endpoint().port();
}

void Worker::start() {
  asio::co_spawn(io_.get_executor(), accept_loop(), asio::detached);
  asio::co_spawn(io_.get_executor(), tick_loop(), asio::detached);
  start_probes(*gen_, nullptr);
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        break;
      } catch (const std::exception& e) {
        // A bug escaped a session; keep serving the others.
        weir::core::note("weir: worker {}: unexpected exception: {}\n", index_, e.what());
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
    // A listener of a SO_REUSEPORT group that closes resets the connections waiting in its accept queue (Linux,
    // unless net.ipv4.tcp_migrate_req is 1): their clients already sent requests another instance cannot see.
    // Taken first, each is served as its request's last; then the listener closes.
    if (acceptor_.is_open()) {
      acceptor_.non_blocking(true, ignored);
      for (int n = 0; n < 4096; ++n) {
        error_code ec;
        auto sock = acceptor_.accept(ec);
        if (ec) break;
        start_session(std::move(sock));
      }
    }
    acceptor_.close(ignored);
    close_idle_sessions();
    // Requests waiting in a batch window go now, and those that join one
    // later at once: a window longer than the time left to the drain's
    // deadline would end them in its 503.
    auto send_batches = [](WorkerGeneration& g) {
      for (const auto& b : g.batchers)
        if (b) b->drain();
    };
    if (gen_) send_batches(*gen_);
    for (const auto& g : retired_) send_batches(*g);
    tick_.cancel();  // re-evaluate now
  });
}

void Worker::close_idle_sessions() {
  for (Session* s = sessions_; s; s = s->next) s->close_if_idle();
}

void Worker::next_request_id(std::string& out) {
  // 8 hex digits of the instance, 2 of the worker, 10 of the counter (as
  // "{:08x}{:02x}{:010x}", written by hand: once per request), then 8 of
  // fresh randomness: unique in the process by the counter, and never
  // predictable, so a client cannot plant (in its own x-request-id) the id
  // a later request will be given.
  // Two digits per table read, the prefix (instance and worker) written once per worker.
  static constexpr auto kPairs = [] {
    std::array<char, 512> t{};
    constexpr char hex[] = "0123456789abcdef";
    for (std::size_t b = 0; b < 256; ++b) {
      t[2 * b] = hex[b >> 4];
      t[2 * b + 1] = hex[b & 0xf];
    }
    return t;
  }();
  auto put = [](char* at, std::size_t digits, std::uint64_t v) {  // `digits` even
    for (std::size_t i = digits; i > 0; i -= 2, v >>= 8) std::memcpy(at + i - 2, &kPairs[2 * (v & 0xff)], 2);
  };
  char id[28];
  if (id_prefix_[0] == 0) {
    put(id_prefix_.data(), 8, static_cast<std::uint32_t>(shared_.instance_id));
    put(id_prefix_.data() + 8, 2, index_ & 0xff);
  }
  std::memcpy(id, id_prefix_.data(), id_prefix_.size());
  put(id + 10, 10, ++request_seq_ & 0xff'ffff'ffffULL);
  if (id_entropy_at_ + 4 > id_entropy_.size()) {
    if (RAND_bytes(id_entropy_.data(), static_cast<int>(id_entropy_.size())) != 1)
      for (auto& b : id_entropy_) b = static_cast<unsigned char>(rng_.next());  // (never: OpenSSL seeds from the OS)
    id_entropy_at_ = 0;
  }
  std::uint32_t r = 0;
  std::memcpy(&r, id_entropy_.data() + id_entropy_at_, 4);
  id_entropy_at_ += 4;
  put(id + 20, 8, r);
  out.assign(id, sizeof id);
}

void Worker::add_session(Session* s) {
  s->next = sessions_;
  s->prev = nullptr;
  if (sessions_) sessions_->prev = s;
  sessions_ = s;
  ++session_count_;
  wake_tick();
}

void Worker::remove_session(Session* s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    sessions_ = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = nullptr;
  if (--session_count_ == 0) {
    // The trim is due kTrimAfter from now (also after a session shorter than a tick).
    idle_since_ = std::chrono::steady_clock::now();
    trimmed_ = false;
  }
}

http::Task<void> Worker::accept_loop() {
  for (;;) {
    auto [ec, sock] = co_await acceptor_.async_accept(use_task);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      // Out of descriptors or memory (the pending connection stays in the
      // listen backlog): counted, told at a bounded rate, and tried again
      // after a pause instead of spinning. The pause is short: a descriptor
      // freed by a finished request lets the next client in within 10 ms.
      http::count_shortage(http::ShortageSite::client_accept, http::shortage_of(ec));
      accept_log_.failed(ec, std::chrono::steady_clock::now());
      http::Timer t(io_.get_executor());
      t.expires_after(kAcceptBackoff);
      co_await t.async_wait(use_task);
      continue;
    }
    if (accept_log_.failing()) accept_log_.succeeded(std::chrono::steady_clock::now());
    start_session(std::move(sock));
  }
}

void Worker::start_session(http::Socket sock) {
  auto s = std::make_unique<Session>(*this, std::move(sock));
  asio::co_spawn(io_.get_executor(), Session::run(std::move(s)), [this](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      weir::core::note("weir: worker {}: session failed: {}\n", index_, ex.what());
    }
  });
}

void Worker::sweep_idle_upstreams() {
  const auto now = core::now();
  for (auto& p : gen_->pools)
    for (std::uint32_t i = 0; i < p->size(); ++i) p->endpoint(i).conns.sweep(now);
}

void Worker::trim_when_idle() {
  // glibc keeps the heap a burst of connections grew (each worker thread has
  // its own arena) until something returns it: after kTrimAfter with no
  // session on this worker, and only once per burst, malloc_trim(0) gives the
  // arenas' free pages back to the kernel (a few hundred µs for a heap of
  // ~100 MB; nothing is being served on this worker then).
  const auto now = std::chrono::steady_clock::now();
  if (session_count_ > 0) {
    idle_since_ = now;
    trimmed_ = false;
    return;
  }
  if (trimmed_ || now - idle_since_ < kTrimAfter) return;
  trimmed_ = true;
  ::malloc_trim(0);
}

http::Task<void> Worker::probe_pool(std::shared_ptr<routing::WorkerPool> pool) {
  const std::string what = fmt::format("worker {}: the health checks of pool {}", index_, pool->config().name);
  const auto* held = &pool;  // (keep_running takes what it calls by pointer: GCC 12)
  co_await core::keep_running(what, [this, held] { return probe_loop(*held); });
}

http::Task<void> Worker::probe_loop(std::shared_ptr<routing::WorkerPool> pool_ptr) {
  auto& pool = *pool_ptr;
  const auto& hc = pool.config().health;
  http::Timer next(io_.get_executor());
  // Workers start their probes spread over the interval, not all at once.
  auto due = std::chrono::steady_clock::now() + hc.interval * (index_ + 1) / (shared_.workers.size() + 1);
  // The pool is still the current generation's (a reload that changed it started another loop).
  auto current = [&] {
    for (const auto& p : gen_->pools)
      if (p == pool_ptr) return true;
    return false;
  };
  for (;;) {
    next.expires_at(due);
    co_await next.async_wait(use_task);
    if (draining_ || !current()) co_return;
    due += hc.interval;
    for (std::uint32_t i = 0; i < pool.size(); ++i) {
      auto& ep = pool.endpoint(i);
      std::string tls_error;
      boost::system::error_code shortage;
      const http::ProbeRequest req{.addr = ep.addr,
                                   .others = ep.addresses,
                                   .host_header = ep.cfg->host_header,
                                   .path = hc.path,
                                   .timeout = hc.timeout,
                                   .tls = ep.tls,
                                   .upstream_lines = pool.config().upstream_lines,
                                   .tls_error = &tls_error,
                                   .shortage = &shortage};
      const http::ProbeResult result = co_await http::probe_health(io_.get_executor(), req);
      if (result == http::ProbeResult::local_shortage) {
        // Weir's own shortage (out of descriptors, ...): the endpoint was
        // not asked, so its state stays as it was (docs/reliability.md).
        http::count_shortage(http::ShortageSite::health_probe, http::shortage_of(shortage));
        probe_log_.failed(shortage, std::chrono::steady_clock::now());
        continue;
      }
      if (probe_log_.failing()) probe_log_.succeeded(std::chrono::steady_clock::now());
      const bool ok = result == http::ProbeResult::healthy;
      // A failed handshake or certificate check says why (at most every 10 s per endpoint).
      if (!ok && !tls_error.empty()) routing::log_tls_failure(ep, pool.config().name, tls_error, core::now());
      if (pool.report_probe(i, ok, std::chrono::steady_clock::now())) {
        ++metrics_.health_transitions;
        weir::core::note("weir: worker {}: pool {} endpoint {} is {} (GET {}{}{})\n", index_, pool.config().name,
                         ep.cfg->display, ok ? "healthy again" : "unhealthy", hc.path,
                         tls_error.empty() ? "" : ": TLS: ", tls_error);
      }
    }
  }
}

bool Worker::tick_has_work() {
  if (log_.pending() || draining_ || !retired_.empty() || (session_count_ == 0 && !trimmed_)) return true;
  bool waiting = false;
  for_each_pool([&](WorkerGeneration&, std::uint32_t, routing::WorkerPool& pool) {
    waiting = waiting || (pool.queue() && pool.queue()->waiting() > 0);
  });
  return waiting;
}

bool Worker::tick_can_rest() {
  if (session_count_ > 0 || !trimmed_ || tick_has_work()) return false;
  for (auto& p : gen_->pools)
    for (std::uint32_t i = 0; i < p->size(); ++i)
      if (p->endpoint(i).conns.idle() > 0) return false;
  return true;
}

http::Task<void> Worker::tick_loop() {
  // Flushes the access log, lets queued requests through, sweeps the idle
  // upstream connections every kSlowTick, and drives the drain. Ticks come
  // kFastTick apart while there is such work, else kSlowTick apart: a
  // worker with nothing to do wakes 4 times a second, not 20 (its CPU at
  // low rates: per SSE event at one stream). A line logged or a request
  // queued meanwhile brings the next tick forward (tick_soon). With no
  // session and nothing pooled to sweep it rests until a session or a
  // reload wakes it (wake_tick): an idle worker makes no system call.
  auto next_sweep = std::chrono::steady_clock::now() + kSlowTick;
  for (;;) {
    tick_slow_ = !tick_has_work();
    tick_resting_ = tick_slow_ && tick_can_rest();
    if (tick_resting_)
      tick_.expires_at(std::chrono::steady_clock::time_point::max());
    else
      tick_.expires_after(tick_slow_ ? kSlowTick : kFastTick);
    auto [ec] = co_await tick_.async_wait(use_task);
    tick_resting_ = false;
    if (ec == asio::error::operation_aborted && !draining_) {
      // tick_soon(): work came while quiet; it waits a fast tick, as it
      // would on a busy worker (so lines logged close together still go
      // out in one write). A drain's cancel ticks at once.
      tick_.expires_after(kFastTick);
      co_await tick_.async_wait(use_task);
    }
    tick_slow_ = false;
    log_.flush();
    dispatch_queues();
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_sweep) {
      sweep_idle_upstreams();
      next_sweep = now + kSlowTick;
    }
    if (!retired_.empty()) free_retired();
    trim_when_idle();
    if (!draining_) continue;
    close_idle_sessions();
    if (std::chrono::steady_clock::now() >= drain_deadline_)
      for (Session* s = sessions_; s; s = s->next) s->force_close();
    if (session_count_ == 0) {
      for (auto& p : gen_->pools)
        for (std::uint32_t i = 0; i < p->size(); ++i) p->endpoint(i).conns.clear();
      log_.flush();
      final_metrics_ = std::make_unique<MetricsShard>(metrics_snapshot());
      stopped_.store(true, std::memory_order_release);
      io_.stop();
      co_return;
    }
  }
}

}  // namespace weir::gateway
