// weir-mock's HTTP/1.1 server: one Worker per thread (own io_context, own
// SO_REUSEPORT acceptor, own token scheduler, own metrics shard), and one
// Connection per accepted socket.
//
// The per-token path: each Worker keeps one timer and a min-heap of due
// (time, connection) entries. When the timer fires it hands every entry due
// within 0.2 ms to its Connection, which formats that step's SSE chunks and
// writes them to its socket, then pushes its next due time; the timer is then
// set for the next due time but no sooner than --tick-us after this pass. So
// thousands of streams share one timer, and dense schedules are served in
// batches (like an engine step), which saves wakeups on both ends.
//
// Cancellation: while a generation runs, its Connection keeps one read
// outstanding on the socket; EOF or an error there means the client went
// away, and the generation is aborted at once (vllm:request_success_total
// {finished_reason="abort"} moves in the same event-loop turn).
//
// TLS (--tls-cert/--tls-key): the same Connection code over an Asio SSL
// stream instead of the socket (a template on the stream type, so the plain
// path's code is what it was: no TLS branch in it), after a server handshake.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl/context.hpp>

#include "config.hpp"
#include "engine.hpp"
#include "metrics.hpp"
#include "util.hpp"

namespace weir::mock {

namespace asio = boost::asio;
using Executor = asio::io_context::executor_type;
using Clock = std::chrono::steady_clock;
using Tcp = asio::ip::tcp;
using Socket = asio::basic_stream_socket<Tcp, Executor>;
using Acceptor = asio::basic_socket_acceptor<Tcp, Executor>;
using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, Executor>;

// What the Worker holds of a connection (its scheduler entries and the
// registry); the served connection is a ConnectionT<Stream> (server.cpp) over
// the plain socket or an SSL stream.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  virtual ~Connection() = default;
  // Scheduler callback: the next step of generation `gen` is due.
  virtual void on_due(std::uint64_t gen, Clock::time_point now) = 0;
  // The sweep found the deadline passed, or the worker shuts down.
  virtual void expire() = 0;
  Clock::time_point deadline() const { return deadline_; }
  std::size_t registry_index = 0;

 protected:
  Clock::time_point deadline_ = Clock::time_point::max();
};

// The server TLS context of --tls-cert/--tls-key (TLS 1.2 at least; with
// --tls-no-resume no tickets and no session cache). Throws with OpenSSL's
// reason when a file does not load or the key does not match.
std::unique_ptr<asio::ssl::context> make_server_tls(const MockConfig& cfg);

// One event-loop thread: accepts, serves and schedules its own connections.
// Every member function except shutdown() runs on the worker's own thread.
class Worker {
 public:
  // `shards` lists every worker's metrics (for /metrics); `shard` is this one's.
  // `engine` (the batch and prefix cache model) is shared by every worker of the instance.
  // `tls` (shared by every worker, outlives them): serve HTTPS; null: plain HTTP.
  Worker(const MockConfig& cfg, int index, MetricsShard& shard, const std::vector<MetricsShard*>& shards,
         Engine& engine, asio::ssl::context* tls = nullptr);
  ~Worker();

  // Binds and listens on `ep` with SO_REUSEADDR and SO_REUSEPORT. Throws
  // boost::system::system_error on failure. Returns the bound port.
  std::uint16_t listen(const Tcp::endpoint& ep);

  // Serves until shutdown() has closed everything. Call on the worker's thread.
  void run();

  // Thread-safe: stops accepting, aborts generations, closes every connection.
  void shutdown();

  // Calls conn->on_due(gen, now) at `at` (within ~0.2 ms).
  void schedule(Clock::time_point at, std::shared_ptr<Connection> conn, std::uint64_t gen);

  const MockConfig& cfg() const { return cfg_; }
  Engine& engine() { return engine_; }
  MetricsShard& metrics() { return shard_; }
  const std::vector<MetricsShard*>& all_metrics() const { return shards_; }
  Rng& rng() { return rng_; }
  HttpDate& date() { return date_; }
  asio::io_context& ioc() { return ioc_; }

  // Connection registry for the idle/timeout sweep and shutdown.
  void add(Connection* c);
  void remove(Connection* c);

 private:
  struct Due {
    Clock::time_point at;
    std::uint64_t gen;
    std::shared_ptr<Connection> conn;
  };
  void accept();
  void arm(Clock::time_point at);
  void on_tick();
  void sweep();

  const MockConfig& cfg_;
  asio::ssl::context* tls_;
  Engine& engine_;
  MetricsShard& shard_;
  const std::vector<MetricsShard*>& shards_;
  asio::io_context ioc_{1};
  Acceptor acceptor_;
  Timer tick_timer_;
  Timer sweep_timer_;
  Timer accept_retry_;
  std::vector<Due> heap_;  // min-heap on `at`
  Clock::time_point armed_ = Clock::time_point::max();
  bool in_tick_ = false;
  Clock::duration min_tick_;  // least time between two ticks (batches dense due times)
  bool stopping_ = false;
  std::vector<Connection*> conns_;
  Rng rng_;
  HttpDate date_;
};

}  // namespace weir::mock
