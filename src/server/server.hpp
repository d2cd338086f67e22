// Process-level wiring: resolve endpoints, open the access log, start one
// worker per core, handle SIGTERM/SIGINT by draining and SIGHUP by reopening
// the access log and reloading the configuration (server/reloader.hpp), and exit.
#pragma once

#include <memory>
#include <optional>

#include "gateway/load_config.hpp"

namespace weir::server {

struct RunOptions {
  std::optional<unsigned> workers;  // -w: overrides the config when given (0: one per core, as the file's 0)
  std::string access_log;           // overrides server.access_log when non-empty
  bool reuse_port = false;       // --reuse-port: share the listen address with other processes (or server.reuse_port)
  gateway::ConfigSource source;  // where `loaded` came from: what SIGHUP loads again
};

// Runs `loaded` (from gateway::load_config, the loader --check uses too:
// nothing is parsed again here) until a signal drains the workers. Returns
// the process exit code (0 after a clean drain, 1 if start-up failed: an
// endpoint that does not resolve, a listen address already served by another
// process or that cannot be opened, an access log that cannot be opened; the
// reason goes to stderr).
int run(gateway::LoadedConfig loaded, const RunOptions& opts);

}  // namespace weir::server
