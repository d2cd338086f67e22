#include "server/server.hpp"

#include <csignal>
#include <random>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <fmt/format.h>

#include "admission/local_limiter.hpp"
#include "admission/redis_limiter.hpp"
#include "auth/jwks_cache.hpp"
#include "auth/redis_keys.hpp"
#include "gateway/worker.hpp"

namespace weir::server {

namespace asio = boost::asio;

int run(gateway::LoadedConfig loaded, const RunOptions& opts) {
  auto config = std::make_shared<core::Config>(std::move(loaded.config));
  if (opts.workers) config->server.workers = opts.workers;
  if (!opts.access_log.empty()) config->server.access_log = opts.access_log;
  unsigned n = config->server.workers ? config->server.workers : std::max(1u, std::thread::hardware_concurrency());

  gateway::Shared shared;
  shared.config = config;
  shared.routes = std::make_unique<routing::RouteTable>(*config);
  shared.instance_id = std::random_device{}() ^ (static_cast<std::uint64_t>(std::random_device{}()) << 32);

  // Endpoint addresses are resolved once, here.
  {
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    for (const auto& p : config->pools) {
      auto& addrs = shared.endpoint_addrs.emplace_back();
      for (const auto& e : p.endpoints) {
        boost::system::error_code ec;
        auto r = resolver.resolve(e.host, std::to_string(e.port), ec);
        if (ec || r.empty()) {
          fmt::print(stderr, "weir: pools.{}: cannot resolve {}: {}\n", p.name, e.display, ec.message());
          return 1;
        }
        addrs.push_back(r.begin()->endpoint());
      }
    }
  }

  // The control plane: signals, JWKS refreshes. Its thread is not a worker.
  asio::io_context main_io;

  // Identity and admission, when the config asks for them.
  std::unique_ptr<auth::JwksCache> jwks;
  std::unique_ptr<admission::Limiter> limiter;
  admission::RedisLimiter* redis_limiter = nullptr;
  std::unique_ptr<auth::RedisKeys> redis_keys;
  if (loaded.auth) {
    // Parsed and validated by gateway::load_config, as --check does: nothing is read from YAML here.
    auto& auth_cfg = loaded.auth;
    shared.pricing = std::move(loaded.pricing);
    if (auth_cfg->jwt) {
      const auto& j = *auth_cfg->jwt;
      auto source = j.jwks_url.empty() ? auth::make_file_jwks_source(j.jwks_file)
                                       : auth::make_http_jwks_source(main_io, j.jwks_url, j.fetch_timeout);
      auth::JwksOptions opt;
      opt.refresh_interval = j.refresh_interval;
      opt.min_refetch_interval = j.min_refetch_interval;
      jwks = std::make_unique<auth::JwksCache>(main_io, std::move(source), opt);
      shared.jwks = jwks.get();
    }
    const auto& redis_cfg = loaded.redis;
    if (auth_cfg->redis_keys && redis_cfg) {
      // Virtual keys created and revoked in Redis (docs/auth.md, "Keys in Redis").
      const auto& rc = *redis_cfg;
      auth::RedisKeysOptions ko;
      ko.client.host = rc.host;
      ko.client.port = rc.port;
      ko.client.db = rc.db;
      ko.client.username = rc.username;
      ko.client.password = rc.password;
      ko.client.connect_timeout = rc.connect_timeout;
      ko.client.command_timeout = rc.command_timeout;
      ko.client.reconnect_max = rc.reconnect_max;
      ko.key_prefix = rc.key_prefix;
      redis_keys = std::make_unique<auth::RedisKeys>(main_io, std::move(ko));
      shared.redis_keys = redis_keys.get();
    }
    shared.auth_policy = auth::AuthPolicy::build(std::move(*auth_cfg));
    if (redis_cfg) {
      // Limits and spend shared with other replicas; leases keep Redis off the request path.
      auto r = std::make_unique<admission::RedisLimiter>(main_io, shared.auth_policy->scopes(), n, *redis_cfg,
                                                         std::chrono::steady_clock::now());
      redis_limiter = r.get();
      shared.redis_limiter = r.get();
      limiter = std::move(r);
    } else {
      limiter = std::make_unique<admission::LocalLimiter>(shared.auth_policy->scopes(), n,
                                                          std::chrono::steady_clock::now());
    }
    shared.limiter = limiter.get();
  }

  std::string err;
  shared.log_sink = core::AccessLogSink::open(config->server.access_log, err);
  if (!shared.log_sink) {
    fmt::print(stderr, "weir: {}\n", err);
    return 1;
  }

  std::vector<std::unique_ptr<gateway::Worker>> workers;
  for (unsigned i = 0; i < n; ++i) workers.push_back(std::make_unique<gateway::Worker>(shared, i));
  for (auto& w : workers) shared.workers.push_back(w.get());

  // One Weir per address unless the operator says otherwise: worker 0 first
  // checks that no other process listens there (SO_REUSEPORT would let it
  // join silently); the other workers join worker 0's port.
  const bool reuse_port = opts.reuse_port || config->server.reuse_port;
  std::uint16_t port = config->server.listen.port;
  for (auto& w : workers) {
    const auto bound = w->listen(config->server.listen, port, !reuse_port && w == workers.front(), err);
    if (bound == 0) {
      fmt::print(stderr, "weir: {}\n", err);
      return 1;
    }
    port = bound;  // port 0: the others join the port the first one got
  }

  std::signal(SIGPIPE, SIG_IGN);
  // SIGINT/SIGTERM drain; SIGHUP (systemd's ExecReload, logrotate) reopens
  // the access log and is otherwise ignored: there is no hot reload yet, and
  // its default action would kill the gateway.
  asio::signal_set signals(main_io, SIGINT, SIGTERM, SIGHUP);
  int signal_count = 0;
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        if (sig == SIGHUP) {
          std::string why;
          if (shared.log_sink->path().empty())
            fmt::print(stderr, "weir: SIGHUP received, ignored (no configuration reload; no access log file)\n");
          else if (shared.log_sink->reopen(why))
            fmt::print(stderr, "weir: SIGHUP received, access log {} reopened\n", shared.log_sink->path());
          else
            fmt::print(stderr, "weir: SIGHUP received: {}; still writing to the old file\n", why);
          signals.async_wait(on_signal);
          return;
        }
        ++signal_count;
        const auto deadline = signal_count == 1 ? std::chrono::steady_clock::now() + config->server.drain_timeout
                                                : std::chrono::steady_clock::now();
        fmt::print(stderr, "weir: {} received, {}\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                   signal_count == 1 ? "draining" : "closing now");
        shared.draining = true;
        if (jwks) jwks->stop();
        for (auto& w : workers) w->drain(deadline);
        signals.async_wait(on_signal);
      };
  signals.async_wait(on_signal);

  if (jwks) jwks->start();
  if (redis_limiter) redis_limiter->start();
  if (redis_keys) redis_keys->start();
  for (auto& w : workers) w->start();
  fmt::print(stderr, "weir: listening on {}:{} with {} worker{}, {} pool{}, {} model{} ({})\n",
             config->server.listen.host, port, n, n == 1 ? "" : "s", config->pools.size(),
             config->pools.size() == 1 ? "" : "s", config->models.size(), config->models.size() == 1 ? "" : "s",
             config->source);

  std::thread signal_thread([&] { main_io.run(); });
  for (auto& w : workers) w->join();
  // Lookups still in flight answer `unavailable` (no worker waits for them any more).
  if (redis_keys) asio::post(main_io, [&] { redis_keys->stop(); });
  if (redis_limiter) {
    // Give unused leases back and push the last spend before leaving.
    asio::co_spawn(main_io, redis_limiter->shutdown(), [&](std::exception_ptr) { main_io.stop(); });
  } else {
    main_io.stop();
  }
  signal_thread.join();
  fmt::print(stderr, "weir: stopped\n");
  return 0;
}

}  // namespace weir::server
