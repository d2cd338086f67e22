#include "http/shortage.hpp"

#include <array>
#include <atomic>
#include <cerrno>

#include <fmt/format.h>

#include "core/metrics.hpp"
#include "core/note.hpp"

namespace weir::http {

namespace {

constexpr std::size_t kSites = static_cast<std::size_t>(ShortageSite::count_);
constexpr std::size_t kKinds = static_cast<std::size_t>(Shortage::count_);
std::array<std::atomic<std::uint64_t>, kSites * kKinds> g_counts{};

std::atomic<std::uint64_t>& cell(ShortageSite where, Shortage what) {
  return g_counts[static_cast<std::size_t>(where) * kKinds + static_cast<std::size_t>(what)];
}

}  // namespace

std::string_view to_string(Shortage s) {
  switch (s) {
    case Shortage::fds:
      return "fds";
    case Shortage::system_fds:
      return "system_fds";
    case Shortage::memory:
      return "memory";
    case Shortage::ports:
      return "ports";
    case Shortage::other:
    case Shortage::count_:
      break;
  }
  return "other";
}

Shortage shortage_of(const boost::system::error_code& ec) {
  if (ec.category() != boost::system::system_category() && ec.category() != boost::system::generic_category())
    return Shortage::other;
  switch (ec.value()) {
    case EMFILE:
      return Shortage::fds;
    case ENFILE:
      return Shortage::system_fds;
    case ENOBUFS:
    case ENOMEM:
      return Shortage::memory;
    case EADDRNOTAVAIL:
      return Shortage::ports;
    default:
      return Shortage::other;
  }
}

void count_shortage(ShortageSite where, Shortage what) { cell(where, what).fetch_add(1, std::memory_order_relaxed); }

std::uint64_t shortages(ShortageSite where, Shortage what) { return cell(where, what).load(std::memory_order_relaxed); }

void append_shortage_metrics(std::string& out) {
  core::PromWriter w(out);
  w.header("weir_accept_errors_total", "counter",
           "accept(2) failures by listener (client, admin) and reason: fds (EMFILE, the process's descriptor limit), "
           "system_fds (ENFILE), memory (ENOBUFS, ENOMEM), other. New connections wait in the listen backlog "
           "meanwhile.");
  for (auto [site, label] : {std::pair{ShortageSite::client_accept, "client"}, {ShortageSite::admin_accept, "admin"}})
    for (auto s : {Shortage::fds, Shortage::system_fds, Shortage::memory, Shortage::other})
      w.sample("weir_accept_errors_total", fmt::format("listener=\"{}\",reason=\"{}\"", label, to_string(s)),
               shortages(site, s));
  w.header("weir_local_resource_failures_total", "counter",
           "Health probes and load scrapes not made because Weir could not open a socket, by reason: fds (EMFILE), "
           "system_fds (ENFILE), memory (ENOBUFS, ENOMEM), ports (EADDRNOTAVAIL). No verdict on the endpoint.");
  for (auto [site, label] :
       {std::pair{ShortageSite::health_probe, "health_probe"}, {ShortageSite::load_scrape, "load_scrape"}})
    for (auto s : {Shortage::fds, Shortage::system_fds, Shortage::memory, Shortage::ports})
      w.sample("weir_local_resource_failures_total", fmt::format("operation=\"{}\",reason=\"{}\"", label, to_string(s)),
               shortages(site, s));
}

ShortageLog::ShortageLog(std::string subject, std::string effect, std::FILE* out)
    : subject_(std::move(subject)), effect_(std::move(effect)), out_(out) {}

void ShortageLog::failed(const boost::system::error_code& ec, Clock::time_point now) {
  if (!failing_) {
    failing_ = true;
    told_ = false;
    run_ = 0;
    run_start_ = now;
  }
  ++run_;
  ++untold_;
  // At most one failure line per kEvery, for every run together: a limit
  // that flaps (a descriptor freed, taken again) starts a run per accept.
  const bool never = last_line_ == Clock::time_point{};
  if (!never && now - last_line_ < kEvery) return;
  const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(now - (never ? run_start_ : last_line_));
  const double secs = static_cast<double>(since.count()) / 1000.0;
  if (told_)
    say(fmt::format("weir: {}: still failing: {} ({} times in the last {:.0f} s)\n", subject_, ec.message(), untold_,
                    secs));
  else if (untold_ == 1)
    say(fmt::format("weir: {}: {}; {}\n", subject_, ec.message(), effect_));
  else  // (earlier runs in the last kEvery were not told: their failures are counted here)
    say(fmt::format("weir: {}: {} ({} times in the last {:.0f} s); {}\n", subject_, ec.message(), untold_, secs,
                    effect_));
  told_ = true;
  untold_ = 0;
  last_line_ = now;
}

void ShortageLog::recovered(Clock::time_point now) {
  failing_ = false;
  if (!told_) return;  // (its failures are told with the next line)
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - run_start_).count();
  say(fmt::format("weir: {}: works again, after {} failure{} over {:.1f} s\n", subject_, run_, run_ == 1 ? "" : "s",
                  static_cast<double>(ms) / 1000.0));
  untold_ = 0;
}

void ShortageLog::say(const std::string& line) {
  // On stderr, without waiting (core/note.hpp): this runs on a worker's accept loop, where a stalled
  // `2>&1` reader would otherwise stop the worker when descriptors are short. Another FILE (a test's):
  // written and flushed.
  if (out_ == stderr) {
    core::note_line(line);
    return;
  }
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

}  // namespace weir::http
