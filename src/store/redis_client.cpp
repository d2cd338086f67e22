#include "store/redis_client.hpp"

#include <array>
#include <deque>
#include <set>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <fmt/format.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

namespace weir::store {

namespace {

using tcp = asio::ip::tcp;
using Socket = asio::basic_stream_socket<tcp, Executor>;
using Resolver = asio::ip::basic_resolver<tcp, Executor>;
using core::Timer;
using core::use_task;

enum class State : std::uint8_t { idle, connecting, connected, backoff, stopped };

// The caller of one exec() batch: its results, filled in order by the read
// loop (or by failure), and a timer that is both the timeout and the wake-up.
struct Waiter {
  Waiter(Executor ex, std::size_t n, std::chrono::milliseconds timeout)
      : timer(ex),
        results(n, tl::unexpected(Error{Errc::timeout, fmt::format("no reply within {} ms", timeout.count())})),
        remaining(n) {}
  Timer timer;
  std::vector<Result<Reply>> results;
  std::size_t remaining;
  bool done = false;
  bool extended = false;  // its deadline was moved once (Impl::fail_all's keep_unsent)

  void complete() {
    done = true;
    timer.cancel();
  }
};

// One command whose reply has not arrived yet.
struct Slot {
  std::shared_ptr<Waiter> waiter;
  std::size_t index = 0;
};

// TCP keepalive on every connection (docs/admission.md, "Redis requirements"): a probe after
// kKeepIdle without traffic, then every kKeepInterval; kKeepCount unanswered probes end the
// connection. 30 s keeps the flow alive in NAT tables, firewalls and cloud load balancers whose
// idle timeouts are 60 s and more (AWS NLB 350 s, Azure LB 4 min, GCP 10 min), and finds a peer
// that vanished without a FIN within 60 s.
constexpr int kKeepIdleS = 30;
constexpr int kKeepIntervalS = 10;
constexpr int kKeepCount = 3;

void set_keepalive(Socket& s) {
  boost::system::error_code ignored;
  s.set_option(asio::socket_base::keep_alive(true), ignored);
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
  s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPIDLE>(kKeepIdleS), ignored);
  s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPINTVL>(kKeepIntervalS), ignored);
  s.set_option(asio::detail::socket_option::integer<IPPROTO_TCP, TCP_KEEPCNT>(kKeepCount), ignored);
#endif
}

bool is_noscript(const Result<Reply>& r) {
  return !r && r.error().code == Errc::server && std::string_view(r.error().message).starts_with("NOSCRIPT");
}

// How drop_connection() tells of a connection dropped for a wrong_server_reply() or a refused_reply().
enum class Wrong : std::uint8_t { no, log, quiet };

}  // namespace

struct Client::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& ioc, ClientOptions o)
      : ex(ioc.get_executor()), opt(std::move(o)), socket(ex), connect_timer(ex), backoff_timer(ex), check_timer(ex) {}

  Executor ex;
  ClientOptions opt;
  Socket socket;
  Timer connect_timer;
  Timer backoff_timer;
  State state = State::idle;
  bool running = false;
  bool writing = false;
  std::uint64_t generation = 0;  // bumped per connection: stale completions ignore themselves
  std::uint64_t attempt = 0;     // bumped per connection attempt: a stale connect timeout ignores itself
  std::string out;               // formatted commands not handed to a write yet
  std::size_t unsent = 0;        // slots at the back of `inflight` whose bytes are still in `out`
  std::deque<Slot> inflight;     // in send order
  ReplyParser parser;
  std::array<char, 16384> rbuf{};
  std::chrono::milliseconds backoff{0};
  // Idle check (ClientOptions::idle_check): a PING in flight on a connection that had been idle;
  // commands queued meanwhile wait in `out` until it is answered.
  bool checking = false;
  Timer check_timer;
  std::chrono::steady_clock::duration check_idle{};   // how long the connection had been idle then
  std::chrono::steady_clock::time_point up_since{};   // when the current connection was established
  std::chrono::steady_clock::time_point last_read{};  // its last bytes from Redis (or up_since)
  bool at_once = false;          // the connection lost is replaced without a backoff wait (drop_connection)
  bool idle_close_said = false;  // the first routine idle close was logged; later ones are counted only
  bool hurry = false;            // reconnect_now(): the next backoff wait is skipped
  // reconnect_now() callers waiting for the connection attempt in progress to end.
  std::vector<std::shared_ptr<Timer>> attempt_waiters;
  // Logs say "connected" once a connection answered a command, "lost" once
  // per outage, and "cannot connect" when the reason changes (Redis that
  // was refusing connections now refuses the password): a server that keeps
  // failing the same way, or accepts connections but never answers
  // (stopped, overloaded), does not flood the log.
  bool announced_up = false;
  bool reported_down = false;
  std::string logged_why;  // the last "cannot connect" reason logged this outage
  std::chrono::steady_clock::time_point logged_at{};
  static constexpr std::chrono::seconds kReasonEvery{1};  // a changed reason is logged at most this often
  // Why commands cannot be sent while waiting to reconnect: the last connect
  // failure, or the loss of the last connection. Empty while connected.
  std::string last_error;
  // The first sentence of the wrong_server_reply() that dropped a connection, until a connection has taken
  // commands for kServingFor again. Meanwhile connections are not announced ("connected"), the backoff is
  // not reset (it goes on doubling up to reconnect_max: a name that still points at a replica, or a
  // misconfigured URL, is tried again every reconnect_max, not every 50 ms), and the same reply drops them
  // without a line.
  std::string wrong_why;
  static constexpr std::chrono::seconds kServingFor{1};
  Stats stats;

  void log(std::string_view msg) const {
    if (opt.log) opt.log(msg);
  }

  // Completes every pending slot: bytes already written get `sent_code`
  // (the command may have run), bytes never written get not_connected.
  // With `keep_unsent`, the slots never written stay queued (with their
  // bytes in `out`) for the next connection instead, and their callers
  // wait up to connect_timeout + command_timeout more, once.
  void fail_all(Errc sent_code, const std::string& why, bool keep_unsent = false) {
    const std::size_t sent = inflight.size() - unsent;
    std::vector<std::shared_ptr<Waiter>> touched;
    for (std::size_t i = 0; i < inflight.size(); ++i) {
      auto& s = inflight[i];
      if (!s.waiter || s.waiter->done) continue;  // (no waiter: the idle check's PING)
      if (keep_unsent && i >= sent) {
        if (!s.waiter->extended) {
          s.waiter->extended = true;
          s.waiter->timer.expires_after(opt.connect_timeout + opt.command_timeout);  // (wakes send(): it waits again)
        }
        continue;
      }
      const Errc code = sent_code == Errc::stopped ? Errc::stopped : (i < sent ? sent_code : Errc::not_connected);
      s.waiter->results[s.index] = tl::unexpected(Error{code, why});
      touched.push_back(s.waiter);
    }
    if (keep_unsent) {
      inflight.erase(inflight.begin(), inflight.begin() + static_cast<std::ptrdiff_t>(sent));
    } else {
      inflight.clear();
      out.clear();
      unsent = 0;
    }
    for (auto& w : touched)
      if (!w->done) w->complete();
  }

  // Ends the current connection (the read loop then returns to the connect loop).
  // Every loss is logged but a routine idle close (below), whose first
  // occurrence only is. The next connection attempt starts at once, with
  // commands queueing meanwhile and those never written kept for it, when
  //  - the idle check failed (its PING went unanswered, or the connection
  //    closed under it): the commands behind it were never sent;
  //  - Redis closed (EOF) a connection that had been up for at least
  //    idle_check: a server `timeout`, a proxy's idle timeout, CLIENT KILL,
  //    a restart. (A server that closes connections at once waits out the
  //    backoff: no reconnect storm.)
  // Otherwise (a command timeout, a write error, bytes that are not RESP, a
  // reply saying this server cannot take commands: `wrong`) the backoff
  // applies and commands fail at once meanwhile.
  // `refused`: the Wrong reply was a refused_reply() (NOAUTH, maxclients), not a wrong_server_reply().
  void drop_connection(const std::string& why, bool eof = false, Wrong wrong = Wrong::no, bool refused = false) {
    const bool was_connected = state == State::connected;
    const bool was_checking = checking;
    checking = false;
    check_timer.cancel();
    if (was_connected) {
      const auto now = std::chrono::steady_clock::now();
      const bool lasted = now - up_since >= opt.idle_check && opt.idle_check.count() > 0;
      const bool quiet = inflight.size() == unsent || (was_checking && inflight.size() == unsent + 1);
      at_once = was_checking || (eof && lasted);
      ++stats.disconnects;
      const bool routine = eof && lasted && quiet && now - last_read >= opt.idle_check;
      if (routine) {
        ++stats.idle_closes;
        if (!idle_close_said) {
          idle_close_said = true;
          log(
              fmt::format("connection to {} closed by server while idle (for {:.1f} s: Redis `timeout`, a "
                          "proxy's idle timeout, CLIENT KILL): reconnected at once; later idle closes are counted, "
                          "not logged",
                          endpoint_text(opt.host, opt.port), std::chrono::duration<double>(now - last_read).count()));
        }
      } else if (wrong == Wrong::no) {
        log(fmt::format("connection to {} lost: {}{}", endpoint_text(opt.host, opt.port), why,
                        at_once ? "; reconnecting at once" : ""));
        announced_up = false;  // the next connection says "connected" again
      } else {
        if (wrong == Wrong::log && refused)
          log(
              fmt::format("connection to {} refused: Redis answered {}{}; reconnecting with backoff (up to {} ms), "
                          "logged again when the answer changes",
                          endpoint_text(opt.host, opt.port), why,
                          why.starts_with("NOAUTH") && opt.password.empty()
                              ? " (Redis requires a password and Weir has none: set redis.password or "
                                "redis.password_env)"
                              : "",
                          opt.reconnect_max.count()));
        else if (wrong == Wrong::log)
          log(
              fmt::format("connection to {} dropped: Redis answered {}: this server does not take Weir's commands "
                          "(a replica, or no longer the master after a failover); reconnecting with backoff, which "
                          "resolves {} again",
                          endpoint_text(opt.host, opt.port), why, opt.host));
        announced_up = false;
      }
      if (!at_once) {
        reported_down = true;
        last_error = (wrong == Wrong::no ? "connection to Redis lost: "
                      : refused          ? "connection to Redis refused: "
                                         : "connection to Redis dropped: ") +
                     why;
      }
    }
    // The completions of this connection's write and read still to come ignore themselves (they would
    // fail the commands kept for the next one).
    if (was_connected) ++generation;
    boost::system::error_code ignored;
    socket.close(ignored);
    writing = false;
    fail_all(Errc::connection_lost, why, was_connected && at_once);
    // Commands issued before the next attempt queue for it when it starts at once (run() skips the wait).
    if (was_connected) state = at_once ? State::connecting : State::backoff;
  }

  // Sends a PING alone and holds the commands queued behind it until it is
  // answered (ClientOptions::idle_check); no answer within command_timeout
  // drops the connection, and they go out on the next one.
  void start_check() {
    checking = true;
    inflight.push_back(Slot{nullptr, 0});
    static const std::string ping = Command{"PING"}.bytes();
    write(asio::buffer(ping), nullptr);
    check_idle = std::chrono::steady_clock::now() - last_read;
    check_timer.expires_after(opt.command_timeout);
    check_timer.async_wait([self = shared_from_this(), gen = generation](boost::system::error_code ec) {
      if (!ec && gen == self->generation) self->check_failed();
    });
  }

  // The idle check's PING got no reply within command_timeout.
  void check_failed() {
    if (!checking || state != State::connected) return;
    ++stats.idle_check_failures;
    drop_connection(
        fmt::format("no reply to a PING within {} ms after {:.1f} s idle (dropped by a NAT, firewall "
                    "or load balancer?)",
                    opt.command_timeout.count(), std::chrono::duration<double>(check_idle).count()));
  }

  // Writes `bytes` (kept alive by `keep`, or static) on the current connection; then what was queued
  // meanwhile (flush()), or the connection is dropped when the write fails.
  void write(asio::const_buffer bytes, std::shared_ptr<std::string> keep) {
    writing = true;
    asio::async_write(socket, bytes,
                      [self = shared_from_this(), keep = std::move(keep), gen = generation](
                          boost::system::error_code ec, std::size_t) {
                        if (gen != self->generation) return;
                        self->writing = false;
                        if (ec) {
                          self->drop_connection("write failed: " + ec.message());
                          return;
                        }
                        self->flush();
                      });
  }

  void flush() {
    if (state != State::connected || writing || checking || out.empty()) return;
    auto buf = std::make_shared<std::string>(std::move(out));
    out.clear();
    unsent = 0;
    write(asio::buffer(*buf), buf);
  }

  void dispatch(Result<Reply> r) {
    if (inflight.empty()) {
      // An error Redis sends unasked ("ERR max number of clients reached" on accept, then it closes) is named.
      if (!r && r.error().code == Errc::server) {
        std::string why = first_sentence(r.error().message);
        if (refused_reply(r.error().message)) {
          refuse(std::move(why));
          return;
        }
        drop_connection("reply without a command: " + why);
        return;
      }
      drop_connection("reply without a command");
      return;
    }
    Slot s = std::move(inflight.front());
    inflight.pop_front();
    if (!s.waiter) {  // the idle check's PING: the connection works; send what waited behind it
      checking = false;
      check_timer.cancel();
      // Their bytes are written now: their command_timeout starts now, not when they were queued (a
      // round trip over half of command_timeout, a distant or briefly slow Redis, timed them out after a
      // PING that answered, and the timeout was taken for an outage).
      for (auto& q : inflight)
        if (q.waiter && !q.waiter->done && !q.waiter->extended) q.waiter->timer.expires_after(opt.command_timeout);
      flush();
      return;
    }
    // A server that cannot take commands (a replica after a failover, READONLY): the connection is
    // dropped, so the next one resolves the name again (a DNS name or a proxy re-pointed at the new
    // master). The reply itself is this command's answer (Errc::server); the others in flight on the
    // connection fail as lost.
    if (!r && r.error().code == Errc::server && wrong_server_reply(r.error().message)) [[unlikely]] {
      std::string why = first_sentence(r.error().message);
      if (!s.waiter->done) {
        s.waiter->results[s.index] = std::move(r);
        if (--s.waiter->remaining == 0) s.waiter->complete();
      }
      ++stats.wrong_server;
      const Wrong how = why == wrong_why ? Wrong::quiet : Wrong::log;
      wrong_why = std::move(why);
      drop_connection(wrong_why, false, how);
      return;
    }
    // A connection Redis refuses to serve (NOAUTH: it wants a password Weir did not send): a failed
    // handshake, not a connection that served. The reply is this command's answer.
    if (!r && r.error().code == Errc::server && refused_reply(r.error().message)) [[unlikely]] {
      std::string why = first_sentence(r.error().message);
      if (!s.waiter->done) {
        s.waiter->results[s.index] = std::move(r);
        if (--s.waiter->remaining == 0) s.waiter->complete();
      }
      refuse(std::move(why));
      return;
    }
    // The backoff is reset (and "connected" logged) once the connection has served: a reply that is not an
    // error, or any reply after kServingFor. An error reply first (a refusal not foreseen above, then a
    // close) leaves the backoff doubling: a server that answers every connection with an error and closes
    // it is tried every reconnect_max, not every 50 ms.
    const bool served = r.has_value() || std::chrono::steady_clock::now() - up_since >= kServingFor;
    if (!announced_up && served) {
      announced_up = true;
      reported_down = false;
      last_error.clear();
      if (wrong_why.empty()) {
        logged_why.clear();
        backoff = std::chrono::milliseconds(0);  // the next failure retries quickly again
        log(fmt::format("connected to {}", endpoint_text(opt.host, opt.port)));
      }
    } else if (!wrong_why.empty() && std::chrono::steady_clock::now() - up_since >= kServingFor) [[unlikely]] {
      log(fmt::format("connected to {} (it takes Weir's commands again after {})", endpoint_text(opt.host, opt.port),
                      wrong_why));
      wrong_why.clear();
      logged_why.clear();
      backoff = std::chrono::milliseconds(0);
    }
    if (s.waiter->done) return;  // timed out: the late reply is dropped
    s.waiter->results[s.index] = std::move(r);
    if (--s.waiter->remaining == 0) s.waiter->complete();
  }

  // Drops a connection Redis refused (a refused_reply(), whose first sentence is `why`): logged when the
  // reason changes, counted as a connect failure; the backoff goes on doubling (wrong_why, as for a
  // wrong_server_reply()) until a connection has served for kServingFor.
  void refuse(std::string why) {
    ++stats.connect_failures;
    const Wrong how = why == wrong_why ? Wrong::quiet : Wrong::log;
    wrong_why = std::move(why);
    drop_connection(wrong_why, false, how, true);
  }

  // Writes AUTH/SELECT and reads their replies on a fresh connection.
  Task<tl::expected<void, std::string>> handshake() {
    std::vector<Command> cmds;
    if (!opt.password.empty()) {
      if (opt.username.empty())
        cmds.push_back(Command{"AUTH", opt.password});
      else
        cmds.push_back(Command{"AUTH", opt.username, opt.password});
    }
    if (opt.db != 0) {
      const std::string db = std::to_string(opt.db);
      cmds.push_back(Command{"SELECT", db});
    }
    if (cmds.empty()) co_return tl::expected<void, std::string>{};
    std::string bytes;
    for (const auto& c : cmds) bytes += c.bytes();
    // (connect_timeout's timer closes the socket: an aborted step is that timeout.)
    const auto failed = [](const char* what, const boost::system::error_code& ec) {
      return ec == asio::error::operation_aborted ? std::string("timed out (connect_timeout)")
                                                  : fmt::format("{} failed: {}", what, ec.message());
    };
    auto [wec, wn] = co_await asio::async_write(socket, asio::buffer(bytes), use_task);
    if (wec) co_return tl::unexpected(failed("write", wec));
    std::size_t got = 0;
    while (got < cmds.size()) {
      auto [ec, n] = co_await socket.async_read_some(asio::buffer(rbuf), use_task);
      if (ec) co_return tl::unexpected(failed("read", ec));
      if (!parser.feed(rbuf.data(), n)) co_return tl::unexpected(std::string("not RESP"));
      Result<Reply> r;
      bool bad = false;
      while (got < cmds.size() && parser.next(r, &bad)) {
        ++got;
        // AUTH/SELECT answer +OK; anything else (WRONGPASS, ERR DB index) is fatal for this attempt.
        if (!r) co_return tl::unexpected(r.error().message);
      }
      if (bad) co_return tl::unexpected(std::string("not RESP"));
    }
    co_return tl::expected<void, std::string>{};
  }

  Task<void> run() {
    auto self = shared_from_this();  // keeps Impl alive while the loop runs
    while (running) {
      state = State::connecting;
      ++attempt;
      connect_timer.expires_after(opt.connect_timeout);
      connect_timer.async_wait([this, self, a = attempt](boost::system::error_code ec) {
        if (!ec && a == attempt && state == State::connecting) {
          boost::system::error_code ignored;
          socket.close(ignored);  // aborts the resolve/connect/handshake step in progress
        }
      });
      std::string why;
      {
        Resolver resolver(ex);
        auto [rec, eps] = co_await resolver.async_resolve(opt.host, std::to_string(opt.port), use_task);
        if (rec) why = "cannot resolve: " + rec.message();
        if (why.empty() && running) {
          socket = Socket(ex);
          // A socket Weir cannot open (EMFILE: its own descriptor limit) is said as that at once: the range
          // connect below waited for connect_timeout instead and was logged "connect timed out", which points
          // at Redis or the network. (The range connect closes and opens the socket again per endpoint.)
          boost::system::error_code oec;
          socket.open(eps.begin()->endpoint().protocol(), oec);
          if (oec) {
            why = "cannot open a socket: " + oec.message();
          } else {
            auto [cec, ep] = co_await asio::async_connect(socket, eps, use_task);
            if (cec) why = cec == asio::error::operation_aborted ? "connect timed out" : cec.message();
          }
        }
      }
      if (why.empty() && running) {
        socket.set_option(tcp::no_delay(true));
        set_keepalive(socket);
        parser.reset();
        auto hs = co_await handshake();
        if (!hs) why = "AUTH/SELECT failed: " + hs.error();
      }
      connect_timer.cancel();
      end_attempt();
      if (!running) break;
      if (!why.empty()) {
        ++stats.connect_failures;
        // Once per outage, and again whenever the reason changes (rate
        // limited: a reason that flips back and forth is one line per
        // kReasonEvery, and a change held back is logged at a later attempt).
        const auto now = std::chrono::steady_clock::now();
        if (!reported_down || (why != logged_why && (logged_why.empty() || now - logged_at >= kReasonEvery))) {
          log(fmt::format("cannot connect to {}: {}", endpoint_text(opt.host, opt.port), why));
          logged_why = why;
          logged_at = now;
        }
        reported_down = true;
        announced_up = false;  // (after a reconnect at once that failed: the next success says "connected")
        last_error = "cannot connect to Redis: " + why;
        boost::system::error_code ignored;
        socket.close(ignored);
        fail_all(Errc::not_connected, last_error);
        co_await wait_backoff();
        continue;
      }

      ++generation;
      state = State::connected;
      ++stats.connects;
      writing = false;
      checking = false;
      at_once = false;
      up_since = last_read = std::chrono::steady_clock::now();
      flush();
      co_await read_loop(generation);
      if (!running) break;
      if (at_once) {
        at_once = false;
        continue;
      }
      co_await wait_backoff();
    }
  }

  Task<void> read_loop(std::uint64_t gen) {
    for (;;) {
      auto [ec, n] = co_await socket.async_read_some(asio::buffer(rbuf), use_task);
      if (gen != generation || state != State::connected) co_return;  // dropped meanwhile
      if (ec) {
        const bool eof = ec == asio::error::eof;
        drop_connection(eof ? std::string("closed by server") : ec.message(), eof);
        co_return;
      }
      last_read = std::chrono::steady_clock::now();
      if (!parser.feed(rbuf.data(), n)) {
        drop_connection("not RESP");
        co_return;
      }
      Result<Reply> r;
      bool bad = false;
      while (state == State::connected && parser.next(r, &bad)) dispatch(std::move(r));
      if (bad) {
        drop_connection("not RESP");
        co_return;
      }
      if (state != State::connected) co_return;
    }
  }

  Task<void> wait_backoff() {
    if (!running) co_return;
    state = State::backoff;
    backoff = backoff.count() == 0 ? opt.reconnect_min : std::min(backoff * 2, opt.reconnect_max);
    if (hurry) {  // reconnect_now() came before this wait began
      hurry = false;
      co_return;
    }
    backoff_timer.expires_after(backoff);
    co_await backoff_timer.async_wait(use_task);
  }

  // Wakes the reconnect_now() callers: the connection attempt ended (state says how).
  void end_attempt() {
    auto waiters = std::move(attempt_waiters);
    attempt_waiters.clear();
    for (auto& t : waiters) t->cancel();
  }

  Task<bool> reconnect_now() {
    auto self = shared_from_this();
    if (state == State::connected) co_return true;
    if (!running) co_return false;
    if (state == State::backoff) {
      hurry = true;  // (the loop may not have begun its wait yet: then it skips it)
      if (backoff_timer.cancel() > 0) hurry = false;
    }
    auto t = std::make_shared<Timer>(ex);
    attempt_waiters.push_back(t);
    // The attempt ends by connect_timeout (its timer closes the socket); a resolve that ignores that ends here.
    t->expires_after(opt.connect_timeout);
    co_await t->async_wait(use_task);
    std::erase(attempt_waiters, t);
    co_return state == State::connected;
  }

  // Queues `cmds` (by pointer: the caller's frame owns them) and waits for
  // their replies or the timeout.
  Task<std::vector<Result<Reply>>> send(const std::vector<const Command*>& cmds) {
    auto self = shared_from_this();
    stats.commands += cmds.size();
    if (state != State::connected && state != State::connecting) {
      const Errc code = state == State::stopped ? Errc::stopped : Errc::not_connected;
      // The reason of the outage (the last connect failure), not only that there is one: it is what the
      // caller's outage line says.
      const std::string why =
          state == State::stopped ? "client stopped" : (last_error.empty() ? "not connected to Redis" : last_error);
      co_return std::vector<Result<Reply>>(cmds.size(), tl::unexpected(Error{code, why}));
    }
    auto w = std::make_shared<Waiter>(ex, cmds.size(), opt.command_timeout);
    // A connection that has been idle may be gone without a FIN (a middlebox forgot it): a PING goes
    // first, and these commands are written only once it is answered (they are never sent on a dead
    // connection, so never retried with an unknown outcome).
    if (state == State::connected && !checking && !writing && inflight.empty() && opt.idle_check.count() > 0 &&
        std::chrono::steady_clock::now() - last_read >= opt.idle_check) {
      ++stats.idle_checks;
      start_check();
    }
    for (std::size_t i = 0; i < cmds.size(); ++i) {
      out += cmds[i]->bytes();
      inflight.push_back(Slot{w, i});
      ++unsent;
    }
    flush();
    w->timer.expires_after(opt.command_timeout);
    // (The timer is re-armed, once, when the commands are kept for the next connection: the wait goes on.)
    while (!w->done) {
      co_await w->timer.async_wait(use_task);
      if (w->done) break;
      if (Timer::clock_type::now() < w->timer.expiry()) continue;
      // (Due with the check's own timer: its commands are all behind the PING, unsent. They move on.)
      if (checking && !w->extended) {
        check_failed();
        continue;
      }
      break;
    }
    if (!w->done) {
      // The results still unfilled keep their initial Errc::timeout.
      w->done = true;
      ++stats.timeouts;
      if (state == State::connected) drop_connection(fmt::format("no reply within {} ms", opt.command_timeout.count()));
    }
    co_return std::move(w->results);
  }

  Task<std::vector<Result<Reply>>> exec(std::vector<Command> cmds) {
    std::vector<const Command*> ptrs;
    ptrs.reserve(cmds.size());
    for (const auto& c : cmds) ptrs.push_back(&c);
    auto results = co_await send(ptrs);

    // NOSCRIPT: Redis restarted or flushed its script cache. Load each script once, then resend.
    std::vector<std::size_t> again;
    std::set<const Script*> scripts;
    for (std::size_t i = 0; i < cmds.size(); ++i)
      if (is_noscript(results[i]) && cmds[i].script()) {
        again.push_back(i);
        scripts.insert(cmds[i].script());
      }
    if (again.empty()) co_return results;
    std::vector<Command> loads;
    for (const Script* s : scripts) loads.push_back(Command{"SCRIPT", "LOAD", s->text()});
    std::vector<const Command*> load_ptrs;
    for (const auto& c : loads) load_ptrs.push_back(&c);
    stats.script_loads += loads.size();
    auto loaded = co_await send(load_ptrs);
    for (std::size_t i = 0; i < loaded.size(); ++i)
      if (!loaded[i]) {
        for (std::size_t j : again) results[j] = tl::unexpected(loaded[i].error());
        co_return results;
      }
    std::vector<const Command*> retry;
    for (std::size_t i : again) retry.push_back(&cmds[i]);
    auto second = co_await send(retry);
    for (std::size_t k = 0; k < again.size(); ++k) results[again[k]] = std::move(second[k]);
    co_return results;
  }

  void stop() {
    running = false;
    const bool was_connected = state == State::connected;
    state = State::stopped;
    ++generation;
    if (was_connected) ++stats.disconnects;
    boost::system::error_code ignored;
    socket.close(ignored);
    connect_timer.cancel();
    backoff_timer.cancel();
    check_timer.cancel();
    checking = false;
    end_attempt();
    fail_all(Errc::stopped, "client stopped");
  }
};

Client::Client(asio::io_context& ioc, ClientOptions options) : impl_(std::make_shared<Impl>(ioc, std::move(options))) {}

Client::~Client() {
  if (impl_->running) impl_->stop();
}

void Client::start() {
  if (impl_->running) return;
  impl_->running = true;
  impl_->state = State::connecting;  // commands issued from now on queue until the first attempt ends
  asio::co_spawn(impl_->ex, impl_->run(), asio::detached);
}

void Client::stop() { impl_->stop(); }

bool Client::connected() const noexcept { return impl_->state == State::connected; }

Task<bool> Client::reconnect_now() {
  auto impl = impl_;  // the frame keeps the state alive
  co_return co_await impl->reconnect_now();
}

Task<Result<Reply>> Client::exec(Command cmd) {
  auto impl = impl_;  // the frame keeps the state alive
  std::vector<Command> one;
  one.push_back(std::move(cmd));
  auto r = co_await impl->exec(std::move(one));
  co_return std::move(r.front());
}

Task<std::vector<Result<Reply>>> Client::exec(std::vector<Command> cmds) {
  auto impl = impl_;
  if (cmds.empty()) co_return std::vector<Result<Reply>>{};
  co_return co_await impl->exec(std::move(cmds));
}

Client::Stats Client::stats() const noexcept { return impl_->stats; }

}  // namespace weir::store
