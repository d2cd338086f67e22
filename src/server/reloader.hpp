// Configuration reloads (docs/operations.md, "Reloading"): SIGHUP, and the
// configuration file's changes when server.watch_config is on. Runs on the
// control thread: loads and validates the file with the loader start-up
// and --check use (gateway::load_config), refuses a file with an error or
// a change that needs a restart (gateway::restart_only_change), resolves
// the endpoints' names off the control thread (a slow DNS server holds up
// neither signals nor the admin API; a drain drops the reload), builds the
// next configuration generation (gateway::build_generation) and auth
// policy (gateway::Services), and posts them to every worker, each of
// which swaps its pointer on its own thread: no lock on the request path,
// and requests in flight finish on the generation they started with. A
// refused file changes nothing: it is logged on stderr with its
// file:line:column: key: reason and counted in weir_config_reloads_total.
#pragma once

#include <sys/stat.h>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "core/async.hpp"
#include "gateway/admin_server.hpp"
#include "gateway/generation.hpp"
#include "gateway/load_config.hpp"
#include "gateway/reload.hpp"
#include "gateway/services.hpp"
#include "gateway/worker.hpp"
#include "routing/load_scraper.hpp"

namespace weir::server {

class Reloader {
 public:
  // `source`: where start-up read the configuration (quick mode: nothing to
  // reload). `overrides`: what the command line fixed. `scraper`: the load
  // scraper of the running generation (replaced by each reload). Everything
  // else outlives the reloader.
  Reloader(boost::asio::io_context& control, gateway::ConfigSource source, gateway::CommandLineOverrides overrides,
           std::optional<unsigned> cli_workers, std::string cli_access_log, gateway::Shared& shared,
           gateway::Services& services, gateway::AdminServer* admin);
  ~Reloader();
  Reloader(const Reloader&) = delete;
  Reloader& operator=(const Reloader&) = delete;

  // Starts the scraper of the start-up generation and, with
  // server.watch_config, the file watch (on the control thread, or before it runs).
  void start();
  // The drain began: no more reloads, no more scrapes.
  void stop();
  // Loads the file and checks it here, then resolves its endpoints' names
  // on a thread of its own (gateway::resolve_names: a slow DNS server never
  // holds up this thread, its signals and the admin API), then applies it
  // here, or says why not (stderr). `why`: what asked ("SIGHUP", "the file
  // changed"). Returns at once. A reload asked for while one is resolving
  // reads the file again after it (once, however many asked); stop() drops
  // the one under way. A configuration read from a pipe is not read again:
  // the first call says so once on stderr, no call counts as a refused reload.
  void reload(std::string_view why);

 private:
  struct Handoff;
  // A reload whose file was read and checked, its names resolving.
  struct Pending {
    std::string why;
    std::shared_ptr<gateway::LoadedConfig> loaded;
    std::shared_ptr<Handoff> handoff;
  };
  void start_reload(std::string_view why);  // reload()'s first half (catches nothing)
  // Back on the control thread with the names resolved: applies `p` (or refuses it), then a reload asked
  // for meanwhile.
  void on_resolved(const Handoff* handoff, std::vector<gateway::Resolution> resolved);
  bool apply(Pending& p, std::vector<gateway::Resolution> resolved);  // on_resolved(), which catches what this throws
  bool refuse(std::string_view why, const std::string& reason);       // counted and said; returns false
  void failed(std::string_view why, const std::exception& e);         // a reload that threw: counted and said
  void abandon();  // the thread of the reload under way (if any) posts nothing any more
  void start_scraper();
  void prune_scrapers();
  void arm_watch();
  core::Task<void> watch_loop();
  // The file's identity now (size, mtime, inode); all zero when it cannot be stat'ed.
  struct FileStamp {
    std::int64_t size = -1, mtime_ns = 0;
    std::uint64_t inode = 0, dev = 0;
    bool operator==(const FileStamp&) const = default;
  };
  FileStamp stamp() const;

  boost::asio::io_context& control_;
  gateway::ConfigSource source_;
  gateway::CommandLineOverrides overrides_;
  std::optional<unsigned> cli_workers_;
  std::string cli_access_log_;
  gateway::Shared& shared_;
  gateway::Services& services_;
  gateway::AdminServer* admin_;
  std::unique_ptr<routing::LoadScraper> scraper_;
  std::vector<std::unique_ptr<routing::LoadScraper>> retired_scrapers_;  // stopped, loops not yet ended
  bool stopped_ = false;
  // The configuration came from a pipe (core::config_rereadable): read once at start-up, never again.
  bool read_once_ = false;
  bool said_read_once_ = false;         // the first SIGHUP said so; the later ones only reopen the logs
  std::uint64_t attempts_ = 0;          // reloads tried
  std::shared_ptr<Pending> reloading_;  // the reload resolving its names, if one is
  std::string again_;                   // a reload asked for during it: its `why` (empty: none)
  bool watching_ = false;
  core::Timer* watch_timer_ = nullptr;  // watch_loop's wait, while it runs (arm_watch ends it on a reload)
  FileStamp seen_;                      // the file as the last reload (or start-up) read it
  // A change the watch saw once; applied when the next look finds it settled (none: no change seen; a
  // missing file's all-zero stamp is a change like any other, seen twice before it counts).
  std::optional<FileStamp> pending_;
};

}  // namespace weir::server
