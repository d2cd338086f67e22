// Process-level wiring: resolve endpoints, open the access log, start one
// worker per core, handle SIGTERM/SIGINT by draining and SIGHUP by reopening
// the access log, and exit.
#pragma once

#include <memory>

#include "core/config.hpp"

namespace weir::server {

struct RunOptions {
  unsigned workers = 0;         // overrides the config when non-zero
  std::string access_log;       // overrides server.access_log when non-empty
  bool reuse_port = false;      // --reuse-port: share the listen address with other processes (or server.reuse_port)
};

// Runs until a signal drains the workers. Returns the process exit code
// (0 after a clean drain, 1 if start-up failed, e.g. the listen address is
// already served by another process; the reason goes to stderr).
int run(std::shared_ptr<core::Config> config, const RunOptions& opts);

}  // namespace weir::server
