// An asynchronous Redis client for the control plane: Boost.Asio sockets and
// C++20 coroutines, hiredis only to format commands and parse replies (RESP2).
// One connection, pipelined; reconnects with exponential backoff; a timeout
// per command; EVALSHA answered NOSCRIPT is retried after SCRIPT LOAD.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "core/async.hpp"
#include "store/redis_replies.hpp"
#include "store/resp.hpp"

namespace weir::store {

namespace asio = boost::asio;
using core::Executor;
using core::Task;

struct ClientOptions {
  std::string host = "127.0.0.1";  // name or address; resolved on every connect
  std::uint16_t port = 6379;
  int db = 0;                                      // SELECT after connect when non-zero
  std::string username;                            // AUTH username password (Redis 6 ACL); empty = AUTH password
  std::string password;                            // empty = no AUTH
  std::chrono::milliseconds connect_timeout{500};  // resolve + TCP connect + AUTH/SELECT
  std::chrono::milliseconds command_timeout{250};  // queueing to reply, per exec() call
  std::chrono::milliseconds reconnect_min{50};     // first delay after a failure; doubles
  std::chrono::milliseconds reconnect_max{2000};   // cap of the doubling
  // A connection without a byte from Redis for this long gets a PING before
  // the next commands, which are written once it is answered; without a reply
  // within command_timeout the connection is dropped and they go out on a new
  // one at once. Zero: no check. (At most 1 s: Redis's shortest `timeout`.)
  std::chrono::milliseconds idle_check{1000};
  // Connection state changes ("connected to ...", "connection to ... lost:
  // ..." for every loss, "cannot connect to ...: <why>" once per outage and
  // again when the reason changes, at most once a second; a routine close of
  // an idle connection by Redis the first time only); called on the control
  // thread. Empty: silent.
  std::function<void(std::string_view)> log;
};

// Threads: construct, start(), stop(), exec() and stats() on the thread that
// runs `ioc` (the control plane), never on a worker. Destroy after stop(), on
// that thread or once `ioc` no longer runs; coroutines still queued keep the
// shared state alive until they finish.
//
// Command semantics:
//  - While connected, commands are appended to one write buffer and written
//    as soon as the previous write finished (pipelining); replies arrive in order.
//  - While a connection attempt is in progress, commands queue and are sent
//    after AUTH/SELECT. The first attempt after Redis closed a connection
//    that had been up for idle_check or more (its `timeout`, a restart), or
//    after an idle check failed, starts at once (no backoff): commands queue
//    for it. While waiting to reconnect after a failure (backoff),
//    exec() fails at once with Errc::not_connected whose message is that
//    failure ("cannot connect to Redis: Connection refused", "connection to
//    Redis lost: closed by server"): callers learn of an outage, and why,
//    without waiting.
//  - A command without a reply within command_timeout fails with
//    Errc::timeout, and a connected client then closes the connection (every
//    reply behind a late one is late too) and reconnects: the other commands
//    in flight fail with Errc::connection_lost (they may have run).
//  - Idle check: the first commands on a connection idle for idle_check wait
//    behind a PING; if it is not answered within command_timeout, they are
//    sent on a new connection (made at once) instead, and their caller waits
//    up to connect_timeout + command_timeout more (once). Never sent on the
//    silent connection, they never run twice.
//  - A reply that says the server cannot take commands (wrong_server_reply():
//    READONLY from a replica, as the old master is after a failover) is that
//    command's answer (Errc::server), and the connection is dropped: the
//    other commands in flight fail with Errc::connection_lost, and the next
//    connection (after the backoff) resolves `host` again, so a DNS name or
//    proxy re-pointed at the new master is followed. While connections keep
//    getting such replies the backoff is not reset (one attempt per
//    reconnect_max at most) and the reply is logged once; "connected" is
//    logged when a connection has taken commands again for 1 s.
//  - A reply that says Redis refuses the connection (refused_reply(): NOAUTH,
//    maxclients) is a failed connection attempt: that command's answer
//    (Errc::server; a reply no command asked for is only logged), the
//    connection dropped, the backoff not reset, the answer logged once per
//    streak. The backoff starts over only once a connection has served: a
//    reply that is not an error, or any reply once it has been up for 1 s.
//  - Every connection has TCP keepalive: idle 30 s, probes every 10 s, 3
//    unanswered end it (keeps NAT/firewall/load-balancer state alive, finds a
//    vanished peer in about 60 s).
class Client {
 public:
  struct Stats {
    std::uint64_t connects = 0;  // connections established (AUTH/SELECT passed)
    std::uint64_t connect_failures = 0;
    std::uint64_t disconnects = 0;          // established connections that were lost or closed
    std::uint64_t commands = 0;             // commands queued
    std::uint64_t timeouts = 0;             // exec() calls that timed out
    std::uint64_t script_loads = 0;         // SCRIPT LOADs after NOSCRIPT
    std::uint64_t idle_checks = 0;          // PINGs sent first on a connection idle for idle_check
    std::uint64_t idle_check_failures = 0;  // ... that got no reply within command_timeout (connection replaced)
    std::uint64_t idle_closes = 0;   // connections Redis closed while idle after at least idle_check (its `timeout`)
    std::uint64_t wrong_server = 0;  // connections dropped for a wrong_server_reply() (READONLY: a replica)
  };

  Client(asio::io_context& ioc, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Connects in the background and keeps reconnecting until stop().
  void start();
  // Closes the connection; pending and later commands fail with Errc::stopped.
  void stop();
  // True while a connection is established and authenticated.
  bool connected() const noexcept;
  // For a last command before stop() (a shutdown's final push): when the
  // client waits to reconnect (backoff), cuts that wait short and starts a
  // connection attempt now; then waits until the attempt in progress ends.
  // Returns connected(): true at once when already connected, false when
  // stopped, not started, or the attempt failed. Takes at most
  // connect_timeout (the attempt's own bound; the wait ends then in any case).
  Task<bool> reconnect_now();

  // Sends one command and returns its reply; Redis error replies come back
  // as Errc::server. EVALSHA (Command::evalsha) is retried once after SCRIPT
  // LOAD when Redis answers NOSCRIPT.
  Task<Result<Reply>> exec(Command cmd);
  // Sends `cmds` in one write (a pipeline) and returns one result per
  // command, in order; the timeout covers the whole batch. NOSCRIPT answers
  // are retried as above, in a second pipeline.
  Task<std::vector<Result<Reply>>> exec(std::vector<Command> cmds);

  Stats stats() const noexcept;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace weir::store
