// What a configuration reload may change, and what it changed
// (docs/operations.md, "Reloading"). Pure functions over two loaded
// configurations; the server's Reloader applies them.
//
// Everything the request path reads reloads (pools and endpoints, models,
// routes, aliases and fallbacks, tenants, keys, limits, budgets, prices,
// timeouts, retry and health settings, server limits for new connections).
// What the process was built around does not: the listeners, the worker
// count, Redis, the admin API, the request-log store, the JWKS cache, the
// /metrics label settings, and whether credentials are checked at all (an
// auth: section there or not; the keys in it reload). A file that changes one of them is refused
// whole: the running configuration then stays exactly one file that was
// validated, never a mix of the old and the new one that no file
// describes (and a later restart would not suddenly apply the rest).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/yaml.hpp"
#include "gateway/load_config.hpp"

namespace weir::gateway {

// What the command line fixed: the file's values of these keys are not the
// running ones, so a change of them in the file is no change.
struct CommandLineOverrides {
  bool listen = false;      // --listen
  bool workers = false;     // -w / --workers
  bool access_log = false;  // --access-log
};

// The first change from `running` to `next` (both from load_config) that
// needs a restart, as a ConfigError naming the file, the line of the
// section in `next` (none when removed) and the dotted key, with why it
// needs a restart; nullopt when `next` can be applied as a reload.
std::optional<core::ConfigError> restart_only_change(const core::Config& running, const core::Config& next,
                                                     const CommandLineOverrides& overrides = {});

// A one-line summary of what `next` changes from `running`, for the log:
// "pools +b -c ~a; models +x -y ~z; tenants +t; server ~max_body; auth
// ~api_keys; pricing +m; default_pool ~" (+ added, - removed, ~ changed:
// the entries of pools, models and tenants, the settings of server, auth
// and pricing), or "no change to ..." when none.
// `rebuilt`: pools whose text is the same but which were built anew (the
// contents of their TLS files, or the addresses their hosts resolve to,
// changed: build_generation): listed as changed too.
std::string describe_changes(const core::Config& running, const core::Config& next,
                             const std::vector<std::string>& rebuilt = {});
// True when `changes` (describe_changes) says nothing changed.
bool no_change(std::string_view changes);

}  // namespace weir::gateway
