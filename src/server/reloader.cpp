#include "server/reloader.hpp"

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include "core/config.hpp"
#include "core/keep_running.hpp"
#include "core/note.hpp"

namespace weir::server {

namespace {

std::int64_t unix_now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// What a reload under way hands from the resolver thread to the control
// thread. `control` is null once the reload was abandoned (a drain began, or
// the Reloader is gone): the thread then drops its result, whenever its last
// name answers.
struct Reloader::Handoff {
  std::mutex mu;
  boost::asio::io_context* control = nullptr;
};

Reloader::Reloader(boost::asio::io_context& control, gateway::ConfigSource source,
                   gateway::CommandLineOverrides overrides, std::optional<unsigned> cli_workers,
                   std::string cli_access_log, gateway::Shared& shared, gateway::Services& services,
                   gateway::AdminServer* admin)
    : control_(control),
      source_(std::move(source)),
      overrides_(overrides),
      cli_workers_(cli_workers),
      cli_access_log_(std::move(cli_access_log)),
      shared_(shared),
      services_(services),
      admin_(admin) {
  read_once_ = !source_.file.empty() && !core::config_rereadable(source_.file);
  seen_ = stamp();
  shared_.reloads.last_success_unix_s.store(unix_now_s(), std::memory_order_relaxed);
  shared_.reloads.generation.store(shared_.generation->id, std::memory_order_relaxed);
}

Reloader::~Reloader() { abandon(); }

void Reloader::abandon() {
  if (!reloading_) return;
  std::lock_guard lock(reloading_->handoff->mu);
  reloading_->handoff->control = nullptr;
}

void Reloader::start() {
  start_scraper();
  arm_watch();
}

void Reloader::stop() {
  stopped_ = true;
  again_.clear();
  if (reloading_) {
    // The drain keeps the generation it began with: the reload under way is dropped, its names left to
    // answer (or not) on their thread.
    abandon();
    weir::core::note("weir: {}: configuration reload abandoned (draining); still serving generation {}\n",
                     reloading_->why, shared_.generation->id);
    reloading_.reset();
  }
  if (scraper_) scraper_->stop();
  if (watch_timer_ != nullptr) watch_timer_->cancel();
}

void Reloader::start_scraper() {
  const auto& gen = shared_.generation;
  std::vector<routing::SharedPoolState*> states;
  std::vector<std::vector<http::tcp::endpoint>> addrs;
  for (const auto& p : gen->pools) {
    states.push_back(p.state.get());
    addrs.push_back(p.addrs);
  }
  if (scraper_) {
    scraper_->stop();
    retired_scrapers_.push_back(std::move(scraper_));
  }
  scraper_ = std::make_unique<routing::LoadScraper>(control_, *gen->config, states, addrs, gen);
  scraper_->start();
  prune_scrapers();
}

void Reloader::prune_scrapers() {
  std::erase_if(retired_scrapers_, [](const auto& s) { return s->idle(); });
}

Reloader::FileStamp Reloader::stamp() const {
  FileStamp s;
  struct stat st {};
  if (source_.file.empty() || ::stat(source_.file.c_str(), &st) != 0) return s;
  s.size = st.st_size;
  s.mtime_ns = std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  s.inode = st.st_ino;
  s.dev = st.st_dev;
  return s;
}

void Reloader::arm_watch() {
  if (watching_) {
    // A reload may have changed the interval: the loop's wait ends now and it reads the interval again
    // (a shortened one applies at once, not after the old one ran out).
    if (watch_timer_ != nullptr) watch_timer_->cancel();
    return;
  }
  if (stopped_ || source_.file.empty()) return;
  if (shared_.generation->config->server.watch_config.count() <= 0) return;
  watching_ = true;
  boost::asio::co_spawn(
      control_,
      core::keep_running("the configuration file watcher (server.watch_config)", [this] { return watch_loop(); }),
      boost::asio::detached);
}

core::Task<void> Reloader::watch_loop() {
  core::Timer timer(control_.get_executor());
  watch_timer_ = &timer;
  for (;;) {
    const auto every = shared_.generation->config->server.watch_config;
    if (stopped_ || every.count() <= 0) break;  // a reload turned it off
    timer.expires_after(every);
    co_await timer.async_wait(core::use_task);
    if (stopped_) break;
    prune_scrapers();
    const FileStamp now = stamp();
    if (now == seen_) {
      pending_.reset();
      continue;
    }
    // Changed: applied once two looks in a row see the same file, so a
    // file being written is not read half-way.
    if (!pending_ || !(now == *pending_)) {
      pending_ = now;
      continue;
    }
    pending_.reset();
    reload("the configuration file changed");
  }
  watch_timer_ = nullptr;
  watching_ = false;
}

void Reloader::reload(std::string_view why) {
  if (reloading_) {
    // One reload at a time; the file is read again when this one ends (the
    // last signal's file wins, as a second SIGHUP after the first would).
    if (again_.empty())
      weir::core::note("weir: {}: a reload is under way (resolving endpoint names); the file is read again after it\n",
                       why);
    again_ = std::string(why);
    return;
  }
  try {
    start_reload(why);
  } catch (const std::exception& e) {
    failed(why, e);
  }
}

// Each outcome is said on stderr before it is counted: whoever sees the count
// move (a scrape of weir_config_reloads_total) finds the line already written.
void Reloader::failed(std::string_view why, const std::exception& e) {
  // A bug, not the file: never let it take the gateway down.
  weir::core::note("weir: {}: configuration reload failed: {}; still serving generation {}\n", why, e.what(),
                   shared_.generation->id);
  shared_.reloads.last_ok.store(false, std::memory_order_relaxed);
  shared_.reloads.failed.fetch_add(1, std::memory_order_relaxed);
}

bool Reloader::refuse(std::string_view why, const std::string& reason) {
  weir::core::note("weir: {}: configuration reload refused: {}; still serving generation {}\n", why, reason,
                   shared_.generation->id);
  shared_.reloads.last_ok.store(false, std::memory_order_relaxed);
  shared_.reloads.failed.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void Reloader::start_reload(std::string_view why) {
  if (stopped_) return;
  ++attempts_;
  if (source_.file.empty()) {
    weir::core::note("weir: {}: no configuration file to reload (quick mode)\n", why);
    return;
  }
  if (read_once_) {
    // Not a refusal (the file is not wrong, and weir_config_last_reload_successful stays as it was): a
    // logrotate postrotate's SIGHUP is expected here, and only reopens the logs.
    if (!said_read_once_)
      weir::core::note(
          "weir: {}: the configuration is not read again: {} is not a regular file (a pipe), read once at "
          "start-up; restart to change it (said once)\n",
          why, source_.file);
    said_read_once_ = true;
    return;
  }
  seen_ = stamp();
  auto loaded = gateway::load_config(source_);
  if (!loaded) {
    refuse(why, loaded.error().to_string());
    return;
  }
  // What the command line fixed stays fixed.
  auto& server = loaded->config.server;
  if (cli_workers_) server.workers = *cli_workers_;
  if (!cli_access_log_.empty()) server.access_log = cli_access_log_;
  if (auto e = gateway::restart_only_change(*shared_.generation->config, loaded->config, overrides_)) {
    refuse(why, e->to_string());
    return;
  }
  // The endpoints' names resolve on a thread of their own (getaddrinfo blocks, for as long as DNS takes): this
  // thread goes on taking signals, serving the admin API and scraping while they do.
  auto pending = std::make_shared<Pending>();
  pending->why = std::string(why);
  pending->loaded = std::make_shared<gateway::LoadedConfig>(std::move(*loaded));
  pending->handoff = std::make_shared<Handoff>();
  pending->handoff->control = &control_;
  // (The thread holds the names and the handoff only: a thread left behind at exit frees nothing of Weir's.)
  std::thread([handoff = pending->handoff, names = gateway::endpoint_names(pending->loaded->config), this] {
    auto resolved = gateway::resolve_names(names);
    std::lock_guard lock(handoff->mu);
    if (handoff->control == nullptr) return;  // abandoned: nothing of the Reloader is touched
    boost::asio::post(*handoff->control, [this, handoff, resolved = std::move(resolved)]() mutable {
      on_resolved(handoff.get(), std::move(resolved));
    });
  }).detach();
  reloading_ = std::move(pending);
}

void Reloader::on_resolved(const Handoff* handoff, std::vector<gateway::Resolution> resolved) {
  if (!reloading_ || reloading_->handoff.get() != handoff) return;  // abandoned (stop) after the thread posted this
  const auto p = std::move(reloading_);
  reloading_.reset();
  try {
    apply(*p, std::move(resolved));
  } catch (const std::exception& e) {
    failed(p->why, e);
  }
  if (!again_.empty() && !stopped_) {
    const std::string why = std::exchange(again_, std::string());
    reload(why);
  }
}

bool Reloader::apply(Pending& p, std::vector<gateway::Resolution> resolved) {
  auto& stats = shared_.reloads;
  const std::string_view why = p.why;
  auto& loaded = p.loaded;
  auto addrs = gateway::take_resolutions(loaded->config, std::move(resolved));
  if (!addrs) return refuse(why, addrs.error().to_string());
  const auto& running = *shared_.generation->config;
  auto auth = services_.prepare_reload(*loaded);
  if (!auth) return refuse(why, auth.error());
  for (const auto& w : loaded->warnings) weir::core::note("weir: warning: {}\n", w);
  gateway::GenerationInput in;
  in.config = std::make_shared<const core::Config>(std::move(loaded->config));
  in.pricing = std::move(loaded->pricing);
  in.tls = std::move(loaded->tls);
  in.policy = auth->policy.get();
  in.workers = static_cast<std::uint32_t>(shared_.workers.size());
  in.resolved = std::move(*addrs);
  auto gen = gateway::build_generation(std::move(in), shared_.generation.get());
  if (!gen) return refuse(why, gen.error());
  // Pools built anew (not carried over) whose name was there before: changed, whatever their text says.
  std::vector<std::string> rebuilt;
  for (const auto& slot : (*gen)->pools)
    for (const auto& old : shared_.generation->pools)
      if (old.cfg->name == slot.cfg->name && old.state != slot.state) rebuilt.push_back(slot.cfg->name);
  std::string changes = gateway::describe_changes(running, *(*gen)->config, rebuilt);
  auto policy = services_.commit_reload(std::move(*auth));
  if (!policy) return refuse(why, policy.error());
  // Applied: from here on nothing fails. The key set first: a key the file
  // withdrew is refused from here on, before the reload is said applied.
  if (const std::string keys = services_.reload_jwks(*loaded); !keys.empty())
    changes = gateway::no_change(changes) ? keys : changes + "; " + keys;
  shared_.generation = *gen;
  if (*policy) {
    shared_.auth_policy = *policy;
    if (admin_) admin_->reloaded(*policy);
  }
  start_scraper();
  arm_watch();
  // Counted and said once every worker has it: from then on every new
  // request runs on it (a worker whose thread is gone, draining, never says).
  struct Applied {
    gateway::ReloadStats* stats;
    const std::uint64_t* attempts;  // the reloader's count of attempts, read on the control thread
    std::uint64_t attempt;          // this one's number
    std::uint64_t id;
    std::string line;
    std::atomic<std::size_t> remaining;
  };
  // Braces, not make_shared's parentheses: Clang 14 (the sanitizer build) lacks P0960.
  auto applied =
      std::shared_ptr<Applied>(new Applied{&stats, &attempts_, attempts_, (*gen)->id,
                                           fmt::format("weir: {}: configuration reloaded from {} (generation {}): {}\n",
                                                       why, source_.file, (*gen)->id, changes),
                                           shared_.workers.size()});
  auto on_all = [applied] {
    auto& st = *applied->stats;
    // Said first, whole, by its size (without waiting: core/note.hpp), then counted (see refuse()).
    weir::core::note_line(applied->line);
    // A later attempt (refused meanwhile) has the last word on "last".
    if (*applied->attempts == applied->attempt) st.last_ok.store(true, std::memory_order_relaxed);
    st.last_success_unix_s.store(unix_now_s(), std::memory_order_relaxed);
    st.generation.store(applied->id, std::memory_order_relaxed);
    st.succeeded.fetch_add(1, std::memory_order_relaxed);
  };
  if (shared_.workers.empty()) on_all();
  for (gateway::Worker* w : shared_.workers)
    w->post_install(*gen, *policy, [applied, on_all, &control = control_] {
      // On the worker's thread; the last one hands the count to the control thread.
      if (applied->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) boost::asio::post(control, on_all);
    });
  return true;
}

}  // namespace weir::server
