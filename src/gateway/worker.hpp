// A worker: one thread, one io_context, its own SO_REUSEPORT listener, its
// own upstream pools, metrics shard and access-log buffer. Workers share
// only the immutable configuration generation (gateway/generation.hpp) and
// the control-plane services.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "admission/admission.hpp"
#include "admission/redis_limiter.hpp"
#include "auth/authenticator.hpp"
#include "batching/batch.hpp"
#include "core/access_log.hpp"
#include "core/config.hpp"
#include "gateway/generation.hpp"
#include "gateway/metrics.hpp"
#include "http/downstream.hpp"
#include "http/io.hpp"
#include "http/shortage.hpp"
#include "http/sse.hpp"
#include "requestlog/store.hpp"
#include "routing/pool.hpp"
#include "routing/route_table.hpp"
#include "tracing/exporter.hpp"

namespace weir::gateway {

namespace asio = boost::asio;

class Session;
class Worker;
class RedisKeyScopes;

// Configuration reloads (docs/operations.md): atomics the control thread
// writes and /metrics reads from any thread.
struct ReloadStats {
  std::atomic<std::uint64_t> succeeded{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<bool> last_ok{true};
  std::atomic<std::int64_t> last_success_unix_s{0};  // set at start-up, then by each applied reload
  std::atomic<std::uint64_t> generation{1};
};

// What the workers share.
struct Shared {
  // The configuration generation workers start on, then the one the last
  // reload applied. Written and read on the control thread only once the
  // workers run (each worker has its own pointer: Worker::generation()).
  std::shared_ptr<const Generation> generation;
  std::shared_ptr<core::AccessLogSink> log_sink;
  std::vector<Worker*> workers;       // for metrics collection
  std::atomic<bool> draining{false};  // SIGTERM received
  // Identity and admission; null when the config has no auth/tenants
  // section. After start the control thread's (admin API, reloads); each
  // worker's Authenticator has its own.
  std::shared_ptr<const auth::AuthPolicy> auth_policy;
  auth::JwksCache* jwks = nullptr;                   // owned by the server; null without auth.jwt
  admission::Limiter* limiter = nullptr;             // owned by the server
  admission::RedisLimiter* redis_limiter = nullptr;  // the same object when limits are shared through Redis
  auth::RedisKeys* redis_keys = nullptr;             // owned by the server; null without auth.redis_keys
  const RedisKeyScopes* redis_key_scopes = nullptr;  // the same lifetime: scopes of keys in Redis (control thread)
  std::uint64_t instance_id = 0;                     // random per process, prefix of generated request ids
  requestlog::Writer* request_log = nullptr;         // owned by the server; null without request_log:
  ReloadStats reloads;
  tracing::Exporter* tracer = nullptr;  // owned by the server; null without tracing:
  // request_log.capture_bodies: the tenants whose bodies are stored; null = none.
  const requestlog::CaptureConfig* capture = nullptr;
};

class Worker {
 public:
  Worker(Shared& shared, unsigned index);
  ~Worker();

  // Binds the listener (SO_REUSEPORT, so the workers share the port). Port 0
  // binds an ephemeral port; the caller passes the port worker 0 got to the
  // others. With `exclusive` it first refuses if another socket already
  // listens on the address (core::probe_listen_address: another Weir would
  // otherwise share the port silently); worker 0 asks for it unless
  // --reuse-port / server.reuse_port. Returns the bound port, or 0 with
  // `error` set.
  std::uint16_t listen(const core::ListenAddress& addr, std::uint16_t port, bool exclusive, std::string& error);
  // Starts the thread.
  void start();
  // Thread-safe: stop accepting, let in-flight responses finish, close idle
  // connections; after `deadline` close everything. The thread exits when no
  // session is left.
  void drain(std::chrono::steady_clock::time_point deadline);
  void join();

  // Thread-safe: installs configuration generation `next` (a reload) by a
  // post to this worker's thread, and `policy` (null: unchanged) into its
  // Authenticator; calls `done` on that thread once it is in. Requests in
  // flight finish on the generation they started with.
  void post_install(std::shared_ptr<const Generation> next, std::shared_ptr<const auth::AuthPolicy> policy,
                    std::function<void()> done);

  // --- used by sessions, on this worker's thread only ---
  asio::io_context& io() { return io_; }
  Shared& shared() { return shared_; }
  // The generation a request starts on now; the request holds it to its end.
  const std::shared_ptr<WorkerGeneration>& generation() const { return gen_; }
  routing::Rng& rng() { return rng_; }
  MetricsShard& metrics() { return metrics_; }
  // A copy of the metrics shard with the pools' queue gauges in it
  // (MetricsShard::add_queue_waiting: the requests waiting now in every
  // pool of the current and retired generations): on this worker's thread only.
  MetricsShard metrics_snapshot();
  // A drained worker's loop stops (its io() runs nothing more): what it
  // counted is then final_metrics(), its last snapshot, for the control
  // thread to merge instead of posting to it (a post would never run, and
  // its counts would drop out of /metrics: a counter going back). Read
  // final_metrics() only once stopped() is true.
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  const MetricsShard& final_metrics() const { return *final_metrics_; }
  core::AccessLog& access_log() { return log_; }
  // Work for the tick came (a line into access_log(), a request into a
  // pool's queue): while the worker ticks slowly (quiet: tick_loop), the
  // slow tick is cut short to a fast one, so that work waits 50 ms at most,
  // as when the worker is busy.
  void tick_soon() {
    if (!tick_slow_) return;
    tick_slow_ = false;
    tick_.cancel();
  }
  // This worker's queue to the request-log store; null without request_log:.
  requestlog::RecordQueue* record_queue() { return record_queue_; }
  // Where a record's line is formatted when the access log is off.
  std::string& record_scratch() { return record_scratch_; }
  // Tracing (tracing:): the exporter (its sampler and config), this
  // worker's queue to it and its id generator; null without tracing:.
  tracing::Exporter* tracer() { return shared_.tracer; }
  tracing::TraceQueue* trace_queue() { return trace_queue_; }
  tracing::IdGenerator& trace_ids() { return trace_ids_; }
  unsigned index() const { return index_; }
  // The authenticate and admit phases; null when auth is not configured.
  auth::Authenticator* authenticator() { return authn_.get(); }
  // Whether the client's credentials are Weir's (checked, and so never sent upstream).
  bool verifies_credentials() const { return authn_ && authn_->verifies_credentials(); }
  // Whether listen() bound a loopback address (gateway::is_loopback): without
  // server.allowed_hosts, /metrics is then answered for IP literals and
  // localhost only (client_host_rule).
  bool loopback_listener() const { return loopback_listener_; }
  admission::Admission* admission() { return admission_.get(); }
  bool draining() const { return draining_; }
  // A new request id: 28 hex digits: the instance (8), the worker (2), a
  // counter (10) and 8 random ones (no client can guess the next).
  void next_request_id(std::string& out);

  void add_session(Session* s);
  void remove_session(Session* s);

  // Request-body storage lent to sessions while a request is read and sent
  // upstream, returned when its response starts streaming: 10k open streams
  // then hold no copy of their request bodies, and a steady load allocates
  // none. take_buffer() returns an empty string (with capacity when one was
  // spare); give_buffer() keeps at most kSpareBytes in all, none above 64 KiB.
  std::string take_buffer();
  void give_buffer(std::string& s);

  // Scratch for the upstream exchange and the stream responder, used only
  // between one recv and the end of its synchronous parse and relay (never
  // across a suspension): what one upstream recv reads, and the body bytes
  // Beast's parser takes out of it. An open stream holds neither.
  std::span<char> stream_read_buffer() { return stream_read_; }
  std::span<char> stream_body_buffer() { return stream_body_; }
  http::ParserSpares& parser_spares() { return parser_spares_; }
  // The events of one upstream read on their way to the client (same rule).
  std::string& stream_events() { return stream_events_; }
  // An event whose ill-formed UTF-8 was replaced (http::replace_invalid_utf8), until the next such event of any
  // stream: its views are used up before the relay of one read returns (same rule; empty until one comes).
  http::Utf8Repair& utf8_repair() { return utf8_repair_; }

 private:
  http::Task<void> accept_loop();
  void start_session(http::Socket sock);  // serves an accepted connection (a Session of its own)
  http::Task<void> tick_loop();
  // Active health probes of `pool`'s endpoints (pools.X.health), every
  // interval, until the worker stops or a reload retires the pool.
  http::Task<void> probe_loop(std::shared_ptr<routing::WorkerPool> pool);
  // probe_loop(pool), started again after an exception (said on stderr: core::keep_running).
  http::Task<void> probe_pool(std::shared_ptr<routing::WorkerPool> pool);
  // This worker's view of `g`: the pools and batchers of `current` that `g`
  // keeps (unchanged pools), new ones for the rest (carrying endpoint state).
  std::shared_ptr<WorkerGeneration> make_generation(std::shared_ptr<const Generation> g, WorkerGeneration* current);
  void install(std::shared_ptr<const Generation> next, std::shared_ptr<const auth::AuthPolicy> policy);
  // Starts the probe loops of `g`'s pools that `before` did not have.
  void start_probes(const WorkerGeneration& g, const WorkerGeneration* before);
  // Frees retired generations no request holds any more (tick).
  void free_retired();
  // Calls f(generation, pool index there, pool) for every pool object of
  // the current generation and of the retired ones, each once.
  template <typename F>
  void for_each_pool(F&& f);
  // Lets requests waiting in the pools' queues (the current generation's
  // and the retired ones') through where the gate opened without a request
  // leaving (the pool is no longer saturated).
  void dispatch_queues();
  void close_idle_sessions();
  // Closes the pooled upstream connections that aged past their pool's
  // idle_keepalive or that the model server closed (ConnectionPool::sweep).
  void sweep_idle_upstreams();
  void trim_when_idle();
  // Whether the next tick has work soon (tick_loop): lines to flush,
  // requests waiting in a pool's queue, retired generations, a trim due,
  // a drain.
  bool tick_has_work();
  // Whether the tick may wait for no time at all: no session, the heap
  // trimmed, no pooled upstream connection to sweep, nothing else to do.
  // A worker at rest makes no system call (nginx's makes none either);
  // wake_tick() ends the wait when a session or a reload comes.
  bool tick_can_rest();
  void wake_tick() {
    if (!tick_resting_) return;
    tick_resting_ = false;
    tick_.cancel();
  }
  // Ticks are kFastTick apart while tick_has_work(), else kSlowTick, the
  // idle-connection sweep's period: a connection the server closed holds
  // its descriptor (CLOSE-WAIT) for at most ~250 ms.
  static constexpr std::chrono::milliseconds kFastTick{50};
  static constexpr std::chrono::milliseconds kSlowTick{250};
  // Time with no session before the worker returns free heap to the kernel
  // (trim_when_idle).
  static constexpr std::chrono::seconds kTrimAfter{1};
  // The pause after a failed accept(2) (out of descriptors) before the next.
  static constexpr std::chrono::milliseconds kAcceptBackoff{10};

  Shared& shared_;
  unsigned index_;
  // Request parsers lent to the sessions (declared before io_: it outlives
  // the sessions, which the io_context's handlers own).
  http::ParserSpares parser_spares_;
  asio::io_context io_;
  http::Acceptor acceptor_;
  bool loopback_listener_ = false;  // loopback_listener(): set by listen()
  routing::Rng rng_;
  MetricsShard metrics_;
  core::AccessLog log_;
  requestlog::RecordQueue* record_queue_ = nullptr;
  std::string record_scratch_;
  tracing::TraceQueue* trace_queue_ = nullptr;
  tracing::IdGenerator trace_ids_;
  std::unique_ptr<auth::Authenticator> authn_;
  std::unique_ptr<admission::Admission> admission_;
  std::shared_ptr<WorkerGeneration> gen_;  // what new requests start on
  // Replaced generations some request (or batch) still uses; freed on a tick once none does.
  std::vector<std::shared_ptr<WorkerGeneration>> retired_;
  std::vector<const routing::WorkerPool*> pools_seen_;  // for_each_pool's scratch
  std::uint64_t request_seq_ = 0;
  std::array<char, 10> id_prefix_{};  // next_request_id's instance and worker digits, once written
  // Random bytes for generated request ids (OpenSSL's RAND_bytes, drawn
  // 2 KiB at a time, for 512 ids: about 20 instructions per id under
  // bench/callgrind, against 108 when drawn 256 bytes at a time): the ids'
  // unguessable part.
  std::array<unsigned char, 2048> id_entropy_{};
  std::size_t id_entropy_at_ = sizeof id_entropy_;
  static constexpr std::size_t kSpareBytes = 1u << 20;
  std::array<char, 16384> stream_read_{};
  std::array<char, 16384> stream_body_{};
  std::string stream_events_;
  http::Utf8Repair utf8_repair_;
  std::vector<std::string> spare_;  // give_buffer()'s, capacity > 0
  std::size_t spare_bytes_ = 0;
  // The stderr reports of accept(2) failing on the client port (out of
  // descriptors: new clients wait in the listen backlog) and of health
  // probes not made for want of a socket (http/shortage.hpp).
  http::ShortageLog accept_log_;
  http::ShortageLog probe_log_;
  Session* sessions_ = nullptr;  // intrusive list of live sessions
  std::size_t session_count_ = 0;
  std::chrono::steady_clock::time_point idle_since_{};  // when session_count_ last fell to 0
  bool trimmed_ = true;        // trim_when_idle ran since the last session ended (nothing to return at start)
  bool tick_slow_ = false;     // the pending tick is a slow one (tick_soon brings it forward)
  bool tick_resting_ = false;  // the pending tick waits for no time (wake_tick ends it)
  bool draining_ = false;
  std::unique_ptr<MetricsShard> final_metrics_;  // (stopped())
  std::atomic<bool> stopped_{false};
  std::chrono::steady_clock::time_point drain_deadline_{};
  std::thread thread_;
  http::Timer tick_;
};

}  // namespace weir::gateway
