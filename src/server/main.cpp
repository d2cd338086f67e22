// weir: the gateway binary.
//   weir --config weir.yaml
//   weir --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000   (quick mode)
#include <csignal>
#include <cstdio>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "core/process_metrics.hpp"
#include "gateway/load_config.hpp"
#include "server/server.hpp"

int main(int argc, char** argv) {
  // SIGHUP reopens the access log once the server runs (server.cpp); until
  // then (loading, resolving, binding) it must not kill the process either.
  std::signal(SIGHUP, SIG_IGN);
  CLI::App app{"Weir: an AI inference gateway (OpenAI-compatible, streams SSE from vLLM pools)", "weir"};
  std::string config_path, listen, upstream, access_log;
  unsigned workers = 0;
  bool check = false;
  bool reuse_port = false;
  app.add_option("-c,--config", config_path, "YAML configuration file");
  app.add_option("--listen", listen, "quick mode: listen address host:port (default 127.0.0.1:8080)");
  app.add_option("--upstream", upstream, "quick mode: send every model to this http:// server");
  app.add_option("-w,--workers", workers, "worker threads (default: config, else one per core)");
  app.add_option("--access-log", access_log, "access log: '-' (stdout), 'off', or a file path");
  app.add_flag("--reuse-port", reuse_port,
               "start even if another process listens on the address, and share it (SO_REUSEPORT), e.g. for a "
               "zero-downtime restart; same as server.reuse_port: true");
  app.add_flag("--check", check, "validate the configuration and exit");
  app.set_version_flag("--version",
                       fmt::format("weir {} ({})", weir::core::build_version(), weir::core::build_commit()));
  CLI11_PARSE(app, argc, argv);

  // One loader for --check and for start-up: both accept and refuse the same files.
  weir::gateway::ConfigSource source;
  if (!config_path.empty()) {
    if (!upstream.empty()) {
      fmt::print(stderr, "weir: give either --config or --upstream, not both\n");
      return 2;
    }
    source.file = config_path;
  } else if (!upstream.empty()) {
    source.upstream = upstream;
  } else {
    fmt::print(stderr, "weir: give --config FILE, or --upstream URL for quick mode (see --help)\n");
    return 2;
  }
  source.listen = listen;
  auto loaded = weir::gateway::load_config(source);
  if (!loaded) {
    fmt::print(stderr, "weir: configuration error: {}\n", loaded.error().to_string());
    return 2;
  }
  for (const auto& w : loaded->warnings) fmt::print(stderr, "weir: warning: {}\n", w);
  if (check) {
    const auto& c = loaded->config;
    fmt::print("{}: ok ({} pools, {} models)\n", c.source, c.pools.size(), c.models.size());
    return 0;
  }
  return weir::server::run(std::move(*loaded), {workers, access_log, reuse_port});
}
