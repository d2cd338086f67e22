// weir-mock: a vLLM-faithful model server for tests, the demo and benchmarks.
// Flags, headers and wire format: tools/mock/README.md.
#include <sys/resource.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>

#include "config.hpp"
#include "core/listen_probe.hpp"
#include "metrics.hpp"
#include "server.hpp"

namespace {

using weir::mock::MockConfig;

// "HOST:PORT", "[V6]:PORT" or ":PORT" (all interfaces).
bool parse_listen(const std::string& s, MockConfig& cfg) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = s.substr(0, colon);
  const std::string port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  try {
    const int p = std::stoi(port);
    if (p < 0 || p > 65535 || std::to_string(p) != port) return false;
    cfg.listen_port = static_cast<std::uint16_t>(p);
  } catch (const std::exception&) {
    return false;
  }
  cfg.listen_host = host;
  return true;
}

// Thousands of streams need thousands of descriptors (vLLM raises it too).
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MockConfig cfg;
  CLI::App app{"weir-mock: a vLLM-faithful OpenAI-compatible model server for tests and benchmarks"};
  std::string listen = "127.0.0.1:8000";
  std::vector<std::string> models;
  app.add_option("--listen", listen, "HOST:PORT to listen on (PORT 0: any free port)")->capture_default_str();
  app.add_option("--ttft-ms", cfg.ttft_ms, "Time to first token, ms")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  app.add_option("--itl-ms", cfg.itl_ms, "Inter-token latency, ms")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  app.add_option("--max-tokens", cfg.max_tokens, "Natural generation length; a smaller request max_tokens wins")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--model", models, "Served model name (repeatable; default mock-model)");
  app.add_flag("--any-model", cfg.any_model, "Accept every model name and echo it back");
  app.add_option("--threads", cfg.threads, "Worker threads, each with its own SO_REUSEPORT acceptor")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--embedding-dim", cfg.embedding_dim, "Embedding size when the request has no dimensions")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-model-len", cfg.max_model_len, "max_model_len reported by /v1/models")->capture_default_str();
  app.add_option("--error-rate", cfg.error_rate, "Probability (0..1) of answering with --error-status")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--error-status", cfg.error_status, "Status of injected errors")
      ->capture_default_str()
      ->check(CLI::Range(400, 599));
  app.add_option("--stall-after", cfg.stall_after, "Stall after this many tokens (-1: never)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  app.add_option("--stall-ms", cfg.stall_ms, "Stall length, ms")->capture_default_str()->check(CLI::Range(0, 3600000));
  app.add_option("--reset-after", cfg.reset_after, "Reset the connection (RST) after this many tokens (-1: never)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  app.add_option("--reset-rate", cfg.reset_rate,
                 "Probability (0..1) that a generation gets the --reset-after RST (the others run to the end)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--tick-us", cfg.tick_us,
                 "Least time between two scheduler passes, us: dense token schedules go out in batches, "
                 "up to this late (0: every due time gets its own pass)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--prefix-cache-tokens", cfg.prefix_cache_tokens,
                 "Prefix cache capacity, tokens (LRU of 16-token blocks; 0: no prefix cache)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--prefill-us-per-token", cfg.prefill_us_per_token,
                 "Prefill time per prompt token not in the prefix cache, us (added to the TTFT)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--max-num-seqs", cfg.max_num_seqs,
                 "Requests running at once; more wait in a FIFO (vllm:num_requests_waiting); 0: unbounded")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--reuse-port", cfg.reuse_port,
               "Start even if another process listens on the address, and share its traffic (SO_REUSEPORT)");
  app.add_option("--keep-alive-s", cfg.keep_alive_s, "Idle keep-alive timeout, s (uvicorn's default is 5)")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  app.add_flag("--no-keep-alive", cfg.no_keep_alive,
               "Close every connection after its response (`connection: close`): each request on a new connection");
  app.add_flag("--stamp", cfg.stamp,
               "Stamp the mock's own time: `\"mock_ns\": N` (request fully read -> this write, ns) first in a "
               "stream's first token chunk and in a non-streamed body, for weir-bench's per-request added latency");
  auto* cert_opt = app.add_option("--tls-cert", cfg.tls_cert,
                                  "Serve HTTPS on --listen with this PEM certificate (chain); needs --tls-key")
                       ->check(CLI::ExistingFile);
  auto* key_opt = app.add_option("--tls-key", cfg.tls_key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  cert_opt->needs(key_opt);
  key_opt->needs(cert_opt);
  app.add_flag("--tls-no-resume", cfg.tls_no_resume,
               "With --tls-cert: no session tickets and no session cache, so every handshake is a full one");
  CLI11_PARSE(app, argc, argv);
  if (!models.empty()) cfg.models = models;
  if (!parse_listen(listen, cfg)) {
    std::cerr << "weir-mock: --listen wants HOST:PORT, got '" << listen << "'\n";
    return 2;
  }

  std::signal(SIGPIPE, SIG_IGN);
  raise_fd_limit();

  // One server context shared by every worker (OpenSSL makes each connection's SSL from it, thread-safe).
  std::unique_ptr<boost::asio::ssl::context> tls;
  if (!cfg.tls_cert.empty()) {
    try {
      tls = weir::mock::make_server_tls(cfg);
    } catch (const std::exception& e) {
      std::cerr << "weir-mock: --tls-cert/--tls-key: " << e.what() << "\n";
      return 2;
    }
  }

  std::vector<std::unique_ptr<weir::mock::MetricsShard>> shard_store;
  std::vector<weir::mock::MetricsShard*> shards;
  for (int i = 0; i < cfg.threads; ++i) {
    shard_store.push_back(std::make_unique<weir::mock::MetricsShard>());
    shards.push_back(shard_store.back().get());
  }
  weir::mock::Engine engine(cfg);
  std::vector<std::unique_ptr<weir::mock::Worker>> workers;
  boost::asio::ip::tcp::endpoint ep;
  try {
    boost::asio::io_context resolve_ctx;
    boost::asio::ip::tcp::resolver resolver(resolve_ctx);
    const auto results =
        resolver.resolve(cfg.listen_host, std::to_string(cfg.listen_port), boost::asio::ip::tcp::resolver::passive);
    ep = results.begin()->endpoint();
    for (const auto& r : results)  // "localhost": prefer 127.0.0.1, what clients usually dial
      if (r.endpoint().address().is_v4()) {
        ep = r.endpoint();
        break;
      }
    // Another process on this address would answer part of the traffic
    // (every thread's acceptor has SO_REUSEPORT): refuse unless asked to share.
    if (!cfg.reuse_port && weir::core::probe_listen_address(ep) == EADDRINUSE) {
      std::cerr << "weir-mock: " << weir::core::format_address(ep)
                << " is already in use by another process (give --reuse-port to share it on purpose)\n";
      return 1;
    }
    for (int i = 0; i < cfg.threads; ++i) {
      workers.push_back(std::make_unique<weir::mock::Worker>(cfg, i, *shards[static_cast<std::size_t>(i)], shards,
                                                             engine, tls.get()));
      const auto port = workers.back()->listen(ep);
      ep.port(port);  // with --listen HOST:0 every worker shares the first one's port
    }
  } catch (const std::exception& e) {
    std::cerr << "weir-mock: cannot listen on " << listen << ": " << e.what() << "\n";
    return 1;
  }

  std::string names;
  for (const auto& m : cfg.models) names += (names.empty() ? "" : ",") + m;
  std::printf("weir-mock listening on %s:%u (threads=%d ttft=%dms itl=%dms max_tokens=%d models=%s%s%s%s)\n",
              ep.address().to_string().c_str(), static_cast<unsigned>(ep.port()), cfg.threads, cfg.ttft_ms, cfg.itl_ms,
              cfg.max_tokens, names.c_str(), cfg.any_model ? " any-model" : "",
              tls ? (cfg.tls_no_resume ? " https no-resume" : " https") : "",
              cfg.no_keep_alive ? " no-keep-alive" : "");
  std::fflush(stdout);

  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&w] { w->run(); });

  // SIGINT/SIGTERM: stop accepting, close every connection, let the loops end.
  boost::asio::io_context signal_ctx;
  boost::asio::signal_set signals(signal_ctx, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (ec) return;
    for (auto& w : workers) w->shutdown();
  });
  signal_ctx.run();
  for (auto& t : threads) t.join();
  return 0;
}
