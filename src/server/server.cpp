#include "server/server.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <future>
#include <random>
#include <system_error>
#include <thread>
#include <utility>
#include <variant>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "core/listen_probe.hpp"
#include "core/note.hpp"
#include "core/process_metrics.hpp"
#include "gateway/admin_server.hpp"
#include "gateway/generation.hpp"
#include "gateway/services.hpp"
#include "gateway/worker.hpp"
#include "requestlog/store.hpp"
#include "server/reloader.hpp"
#include "tracing/exporter.hpp"

namespace weir::server {

namespace asio = boost::asio;

// How long the request-log writer may take, after the workers stopped, to
// store the records still queued.
constexpr auto kRequestLogDrain = std::chrono::seconds(5);
// The same for the trace exporter's queued spans.
constexpr auto kTracingDrain = std::chrono::seconds(4);  // (+1 s for an export under way: at most 5 s in all)

// The resource every exported span belongs to (tracing:).
tracing::Resource trace_resource(const tracing::TracingConfig& c, std::uint64_t instance_id) {
  tracing::Resource r;
  r.service_name = c.service_name;
  r.service_version = std::string(core::build_version());
  r.instance_id = fmt::format("{:016x}", instance_id);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) r.host_name = host;
  r.extra = c.resource;
  return r;
}

// Resolves `names` (gateway::resolve_names) on a thread of its own while
// this one waits for them or for a stop signal (SIGINT, SIGTERM, SIGQUIT:
// main() holds them blocked until the handler is in place, so they are read
// here through a signalfd): a name that resolves slowly, or a DNS server that
// does not answer, does not keep a stop from ending start-up. Returns the
// resolutions, or the stop signal's name when one came first (the thread is
// then left to its names: it holds nothing but them). The signals not taken
// stay pending for the handler.
std::variant<std::vector<gateway::Resolution>, const char*> resolve_or_stop(std::vector<gateway::EndpointName> names) {
  struct Job {
    std::vector<gateway::EndpointName> names;
    std::promise<std::vector<gateway::Resolution>> done;
    int event = -1;  // written once `done` is set
    ~Job() {
      if (event >= 0) ::close(event);
    }
  };
  sigset_t stops;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGQUIT}) sigaddset(&stops, sig);
  auto job = std::make_shared<Job>();
  job->names = std::move(names);
  job->event = ::eventfd(0, EFD_CLOEXEC);
  const int sigfd = ::signalfd(-1, &stops, SFD_CLOEXEC);
  if (job->event < 0 || sigfd < 0) {  // (out of descriptors: resolved here, as before)
    if (sigfd >= 0) ::close(sigfd);
    return gateway::resolve_names(job->names);
  }
  auto result = job->done.get_future();
  try {
    std::thread([job] {
      job->done.set_value(gateway::resolve_names(job->names));
      const std::uint64_t one = 1;
      (void)!::write(job->event, &one, sizeof one);
    }).detach();
  } catch (const std::system_error&) {  // (no thread to be had: resolved here, as before)
    ::close(sigfd);
    return gateway::resolve_names(job->names);
  }
  pollfd fds[2] = {{.fd = job->event, .events = POLLIN, .revents = 0}, {.fd = sigfd, .events = POLLIN, .revents = 0}};
  while (::poll(fds, 2, -1) < 0 && errno == EINTR) {
  }
  const char* stopped = nullptr;
  if ((fds[1].revents & POLLIN) != 0 && (fds[0].revents & POLLIN) == 0) {
    signalfd_siginfo info{};
    if (::read(sigfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
      stopped = info.ssi_signo == SIGINT ? "SIGINT" : info.ssi_signo == SIGQUIT ? "SIGQUIT" : "SIGTERM";
  }
  ::close(sigfd);
  if (stopped != nullptr) return stopped;
  return result.get();
}

int run(gateway::LoadedConfig loaded, const RunOptions& opts) {
  // A listen host that does not resolve, or an admin listener on the client
  // listener's address, is the configuration error --check gives.
  if (auto ok = gateway::check_listen_addresses(loaded); !ok) {
    fmt::print(stderr, "weir: configuration error: {}\n", ok.error());
    return 2;
  }
  auto config = std::make_shared<core::Config>(std::move(loaded.config));
  if (opts.workers) config->server.workers = *opts.workers;
  if (!opts.access_log.empty()) config->server.access_log = opts.access_log;
  unsigned n = config->server.workers ? config->server.workers : std::max(1u, std::thread::hardware_concurrency());

  gateway::Shared shared;
  shared.instance_id = std::random_device{}() ^ (static_cast<std::uint64_t>(std::random_device{}()) << 32);

  // The control plane: signals, JWKS refreshes, Redis syncs, load scrapes, reloads. Its thread is not a worker.
  asio::io_context main_io;
  gateway::Services services(main_io, loaded, n);
  if (!services.error().empty()) {
    // An admin.keys_file that cannot be read or is not a valid keys file: --check refuses it too.
    auto e = core::config_error(core::node_at(config->root, "admin.keys_file"), "", services.error());
    e.file = config->source;
    fmt::print(stderr, "weir: configuration error: {}\n", e.to_string());
    return 2;
  }
  services.attach(shared);

  // The first configuration generation: endpoint addresses resolved here, pools' shared state, metric labels.
  {
    auto resolved = resolve_or_stop(gateway::endpoint_names(*config));
    if (const auto* sig = std::get_if<const char*>(&resolved)) {
      weir::core::note("weir: {} received while resolving the endpoints' names at start-up: stopped\n", *sig);
      return 0;
    }
    auto addrs = gateway::take_resolutions(*config, std::move(std::get<0>(resolved)));
    if (!addrs) {
      // (An endpoint that does not resolve: a configuration error, as --check says.)
      fmt::print(stderr, "weir: configuration error: {}\n", addrs.error().to_string());
      return 2;
    }
    gateway::GenerationInput in;
    in.resolved = std::move(*addrs);
    in.config = config;
    in.pricing = std::move(loaded.pricing);
    in.tls = loaded.tls;  // built (and checked) by load_config, so --check refuses what start-up would
    in.policy = shared.auth_policy.get();
    in.workers = n;
    auto gen = gateway::build_generation(std::move(in), nullptr);
    if (!gen) {
      // (An endpoint that does not resolve: a configuration error, as --check says.)
      fmt::print(stderr, "weir: configuration error: {}\n", gen.error());
      return 2;
    }
    shared.generation = std::move(*gen);
  }

  std::string err;
  shared.log_sink = core::AccessLogSink::open(config->server.access_log, err);
  if (!shared.log_sink) {
    // What --check refuses too (exit 2): a file that cannot be opened for appending.
    auto e = opts.access_log.empty()
                 ? core::config_error(core::node_at(config->root, "server.access_log"), "server.access_log", err)
                 : core::ConfigError{.key = "--access-log", .message = err};
    e.file = config->source;
    fmt::print(stderr, "weir: configuration error: {}\n", e.to_string());
    return 2;
  }

  // The request-log store's writer (request_log:): its queues exist before
  // the workers that fill them, and it outlives them (stopped after join).
  std::unique_ptr<requestlog::Writer> request_log;
  if (loaded.request_log) {
    request_log = std::make_unique<requestlog::Writer>(*loaded.request_log, n);
    shared.request_log = request_log.get();
    if (request_log->config().capture) shared.capture = &*request_log->config().capture;
  }

  // The trace exporter (tracing:): the same life as the request-log writer.
  std::unique_ptr<tracing::Exporter> tracer;
  if (loaded.tracing) {
    tracer =
        std::make_unique<tracing::Exporter>(*loaded.tracing, n, trace_resource(*loaded.tracing, shared.instance_id));
    shared.tracer = tracer.get();
  }

  std::vector<std::unique_ptr<gateway::Worker>> workers;
  for (unsigned i = 0; i < n; ++i) workers.push_back(std::make_unique<gateway::Worker>(shared, i));
  for (auto& w : workers) shared.workers.push_back(w.get());

  // One Weir per address unless the operator says otherwise: worker 0 (and
  // the admin listener) first check that no other process listens there
  // (SO_REUSEPORT would let it join silently); the other workers join
  // worker 0's port.
  const bool reuse_port = opts.reuse_port || config->server.reuse_port;

  // The admin API: its own listener on the control thread, never a worker's.
  std::unique_ptr<gateway::AdminServer> admin;
  std::uint16_t admin_port = 0;
  if (loaded.admin) {
    admin = std::make_unique<gateway::AdminServer>(main_io, *loaded.admin, shared, services.key_store());
    admin_port = admin->listen(!reuse_port, err);
    if (admin_port == 0) {
      fmt::print(stderr, "weir: {}\n", err);
      return 1;
    }
  }

  std::uint16_t port = config->server.listen.port;
  for (auto& w : workers) {
    const auto bound = w->listen(config->server.listen, port, !reuse_port && w == workers.front(), err);
    if (bound == 0) {
      fmt::print(stderr, "weir: {}\n", err);
      return 1;
    }
    port = bound;  // port 0: the others join the port the first one got
  }

  // Configuration reloads: SIGHUP, and the file's changes with server.watch_config.
  Reloader reloader(main_io, opts.source,
                    {.listen = !opts.source.listen.empty(),
                     .workers = opts.workers.has_value(),
                     .access_log = !opts.access_log.empty()},
                    opts.workers, opts.access_log, shared, services, admin.get());

  std::signal(SIGPIPE, SIG_IGN);
  // Log rotation: SIGHUP and SIGUSR1 (nginx's and Envoy's "reopen the logs",
  // what logrotate postrotate scripts send) reopen the access log. One that
  // cannot be opened (a directory removed, EACCES, EMFILE) leaves the lines
  // going to the old, rotated file: counted
  // (weir_access_log_reopen_failures_total), shown while it lasts
  // (weir_access_log_reopen_pending 1), and tried again every second until
  // it opens, so a condition that passes does not need another signal.
  asio::steady_timer reopen_retry(main_io);
  std::function<void(const boost::system::error_code&)> on_reopen_retry = [&](const boost::system::error_code& ec) {
    if (ec || !shared.log_sink->reopen_pending()) return;
    std::string why;
    if (shared.log_sink->retry_reopen(why)) {
      weir::core::note("weir: access log {} reopened (retried after a failed reopen)\n", shared.log_sink->path());
      return;
    }
    reopen_retry.expires_after(std::chrono::seconds(1));
    reopen_retry.async_wait(on_reopen_retry);
  };
  auto reopen_access_log = [&](const char* sig) {
    if (shared.log_sink->path().empty()) return;  // stdout or off: nothing to reopen
    std::string why;
    if (shared.log_sink->reopen(why)) {
      reopen_retry.cancel();
      weir::core::note("weir: {} received, access log {} reopened\n", sig, shared.log_sink->path());
      return;
    }
    weir::core::note("weir: {} received: {}; still writing to the old file, trying again every second\n", sig, why);
    reopen_retry.expires_after(std::chrono::seconds(1));
    reopen_retry.async_wait(on_reopen_retry);
  };
  // SIGINT/SIGTERM/SIGQUIT drain (SIGQUIT is nginx's graceful stop);
  // SIGHUP (systemd's ExecReload, logrotate) reopens
  // the access log, then reloads the configuration file; SIGUSR1 only
  // reopens the access log; SIGUSR2 (no meaning here) is ignored: the
  // default action of both would end the process at once, without a drain.
  // (main() ignores the other signals whose default would.)
  asio::signal_set signals(main_io, SIGINT, SIGTERM, SIGHUP);
  signals.add(SIGQUIT);
  signals.add(SIGUSR1);
  signals.add(SIGUSR2);
  int signal_count = 0;
  bool said_usr2 = false;
  std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec,
                                                                             int sig) {
    if (ec) return;
    if (sig == SIGUSR1) {
      reopen_access_log("SIGUSR1");
      signals.async_wait(on_signal);
      return;
    }
    if (sig == SIGUSR2) {
      if (!std::exchange(said_usr2, true))
        weir::core::note("weir: SIGUSR2 received and ignored (it has no meaning to Weir; said once)\n");
      signals.async_wait(on_signal);
      return;
    }
    if (sig == SIGHUP) {
      reopen_access_log("SIGHUP");
      // A drain keeps the configuration and deadline it began with (a reload
      // then would start scrapers, fetches and watches that the drain stopped).
      if (signal_count == 0)
        reloader.reload("SIGHUP");
      else
        weir::core::note(
            "weir: SIGHUP received while draining: the configuration is not reloaded (the drain keeps its "
            "deadline, server.drain_timeout {} ms as it began)\n",
            shared.generation->config->server.drain_timeout.count());
      signals.async_wait(on_signal);
      return;
    }
    ++signal_count;
    const auto drain_timeout = shared.generation->config->server.drain_timeout;
    const auto deadline =
        signal_count == 1 ? std::chrono::steady_clock::now() + drain_timeout : std::chrono::steady_clock::now();
    weir::core::note("weir: {} received, {}\n",
                     sig == SIGINT    ? "SIGINT"
                     : sig == SIGQUIT ? "SIGQUIT"
                                      : "SIGTERM",
                     signal_count == 1 ? "draining" : "closing now");
    shared.draining = true;
    services.begin_drain();
    reloader.stop();
    // The admin listener stays open through the drain (it closes once the
    // workers are done): /ready answers 503 there, and /metrics and the
    // admin API still answer, while the client port no longer accepts.
    // Unless a new instance shares its port (a restart with --reuse-port):
    // then admin calls go to that one from now on.
    if (admin && signal_count == 1 && admin->drain())
      weir::core::note("weir: admin API closed: another process listens on {} (--reuse-port) and takes it over\n",
                       core::format_host_port(loaded.admin->listen.host, admin_port));
    for (auto& w : workers) w->drain(deadline);
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  // main() blocked SIGINT, SIGTERM, SIGQUIT, SIGUSR1 and SIGUSR2 until now (the ports
  // were bound while their default action would have killed the process):
  // the handler is in place, so one that came during start-up is delivered
  // here (a drain, a reopen).
  // (The threads started so far keep them blocked: the kernel delivers them
  // to one that does not.)
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGQUIT);
  sigaddset(&stop_signals, SIGUSR1);
  sigaddset(&stop_signals, SIGUSR2);
  pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);

  services.start();
  reloader.start();
  if (admin) {
    admin->start();
    weir::core::note("weir: admin API on {}{}{}\n", core::format_host_port(loaded.admin->listen.host, admin_port),
                     !services.key_store() ? " (no tenants: runtime keys off)"
                     : loaded.auth && loaded.auth->redis_keys && loaded.redis
                         ? ", runtime keys in Redis (auth.redis_keys)"
                     : services.key_store()->persistent() ? ", runtime keys in " + loaded.admin->keys_file
                                                          : ", runtime keys in memory only (no admin.keys_file)",
                     // (The loopback default refuses names other than localhost: say so where an operator looks.)
                     admin->host_rule().kind == core::HostRule::Kind::local
                         ? "; Host: IP literals and localhost only (admin.allowed_hosts)"
                         : "");
  }
  if (request_log) request_log->start();
  if (tracer) {
    tracer->start();
    weir::core::note("weir: tracing to {} (sample_ratio {}, service {})\n", loaded.tracing->endpoint.display,
                     loaded.tracing->sample_ratio, loaded.tracing->service_name);
  }
  for (auto& w : workers) w->start();
  weir::core::note("weir: listening on {} with {} worker{}, {} pool{}, {} model{} ({}){}\n",
                   core::format_host_port(config->server.listen.host, port), n, n == 1 ? "" : "s", config->pools.size(),
                   config->pools.size() == 1 ? "" : "s", config->models.size(), config->models.size() == 1 ? "" : "s",
                   config->source,
                   // (As the admin line: the loopback default refuses other names for /metrics.)
                   !config->server.allowed_hosts && workers.front()->loopback_listener()
                       ? "; Host: only IP literals and localhost for /metrics (server.allowed_hosts)"
                       : "");

  std::thread signal_thread([&] { main_io.run(); });
  for (auto& w : workers) w->join();
  if (admin) asio::post(main_io, [&] { admin->stop(); });
  asio::co_spawn(main_io, services.stop(), [&](std::exception_ptr) { main_io.stop(); });
  signal_thread.join();
  // Bounded: what the writer cannot store within 5 s more is dropped and counted.
  if (request_log && !request_log->stop(std::chrono::steady_clock::now() + kRequestLogDrain)) {
    // Its thread is stuck in a store call (a server that stopped answering): it is left to the
    // process's exit, and so is the writer it uses.
    weir::core::note(
        "weir: request log: the store did not answer within the drain; the records still queued are "
        "not written\n");
    (void)request_log.release();
  }
  // Bounded as the request log is: an export stuck on a collector that does not answer is left behind.
  if (tracer) {
    const bool drained = tracer->stop(std::chrono::steady_clock::now() + kTracingDrain);
    // Not drained: an export was still under way, on a collector that answers slowly or not at all (it may
    // have taken some of the drain's batches). Either way the counts say what became of the spans.
    if (!drained)
      weir::core::note(
          "weir: tracing: the drain ran out of time with an export still under way (the collector answers slowly "
          "or not at all); what is still queued is not exported\n");
    tracer->say_final();
    if (!drained) (void)tracer.release();
  }
  weir::core::note("weir: stopped\n");
  return 0;
}

}  // namespace weir::server
