#include "routing/load.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace weir::routing {

namespace {

// What follows a sample's metric name: `{labels} value [timestamp]` or
// ` value [timestamp]`, blanks allowed before the labels (Prometheus text
// format 0.0.4).
enum class Sample : std::uint8_t {
  other,   // the name goes on (another family that starts with this one)
  bad,     // this family, but no readable value: cut labels, a value that is no number, NaN or ±Inf
  finite,  // this family, with a finite value
};

// `rest` is what follows the name; the value goes to `v`.
Sample sample_value(std::string_view rest, double& v) {
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  if (!rest.empty()) {
    const char c = rest.front();
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':')
      return Sample::other;
  }
  while (!rest.empty() && blank(rest.front())) rest.remove_prefix(1);
  if (!rest.empty() && rest.front() == '{') {
    // Skip the labels: quoted values may hold '}' and escaped quotes.
    bool quoted = false;
    std::size_t i = 1;
    for (; i < rest.size(); ++i) {
      const char c = rest[i];
      if (quoted) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          quoted = false;
      } else if (c == '"') {
        quoted = true;
      } else if (c == '}') {
        break;
      }
    }
    if (i >= rest.size()) return Sample::bad;
    rest.remove_prefix(i + 1);
    if (rest.empty() || !blank(rest.front())) return Sample::bad;
    while (!rest.empty() && blank(rest.front())) rest.remove_prefix(1);
  }
  const auto end = rest.find_first_of(" \t\r");
  std::string_view num = rest.substr(0, end);
  // Go's ParseFloat, which Prometheus reads values with, takes a leading '+' (from_chars does not).
  if (num.size() > 1 && num.front() == '+' && num[1] != '-') num.remove_prefix(1);
  if (num.empty() || num.size() > 64) return Sample::bad;
  const auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (ec != std::errc() || p != num.data() + num.size() || !std::isfinite(v)) return Sample::bad;
  return Sample::finite;
}

std::uint32_t count_of(double v) {
  if (!(v > 0)) return 0;
  return v >= 1e9 ? 1'000'000'000u : static_cast<std::uint32_t>(std::llround(v));
}

}  // namespace

std::optional<VllmLoad> parse_vllm_load(std::string_view text) {
  VllmLoad l;
  bool any = false, kv_new = false;
  double kv_old = 0;
  bool have_kv_old = false;
  double running = 0, waiting = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.size() < 6 || line[0] != 'v' || !line.starts_with("vllm:")) continue;
    struct Family {
      std::string_view name;
      int which;
    };
    for (const Family f : {Family{"vllm:num_requests_running", 0}, Family{"vllm:num_requests_waiting", 1},
                           Family{"vllm:kv_cache_usage_perc", 2}, Family{"vllm:gpu_cache_usage_perc", 3}}) {
      if (!line.starts_with(f.name)) continue;
      double v = 0;
      const Sample got = sample_value(line.substr(f.name.size()), v);
      if (got == Sample::other) continue;  // a longer name: another family (none of these is a prefix of another)
      // A request count Weir cannot read fails the page: read as 0 it would make the endpoint look idle.
      if (got == Sample::bad) {
        if (f.which <= 1) return std::nullopt;
        break;  // a KV-cache sample: only the queue's saturation gate reads it
      }
      switch (f.which) {
        case 0:
          running += std::max(v, 0.0);  // each sample clamped: one engine's -8 does not hide another's 10
          any = true;
          break;
        case 1:
          waiting += std::max(v, 0.0);
          any = true;
          break;
        case 2:
          l.kv_usage = kv_new ? std::max(l.kv_usage, v) : v;
          kv_new = true;
          break;
        default:
          kv_old = have_kv_old ? std::max(kv_old, v) : v;
          have_kv_old = true;
      }
      break;
    }
  }
  if (!any) return std::nullopt;
  l.running = count_of(running);
  l.waiting = count_of(waiting);
  if (!kv_new && have_kv_old) l.kv_usage = kv_old;
  l.kv_usage = std::clamp(l.kv_usage, 0.0, 1.0);
  return l;
}

std::string_view scrape_failure_label(ScrapeFailure f) {
  switch (f) {
    case ScrapeFailure::connect:
      return "connect";
    case ScrapeFailure::timeout:
      return "timeout";
    case ScrapeFailure::tls:
      return "tls";
    case ScrapeFailure::read:
      return "read";
    case ScrapeFailure::too_large:
      return "too_large";
    case ScrapeFailure::status:
      return "status";
    case ScrapeFailure::not_vllm:
    case ScrapeFailure::count_:
      break;
  }
  return "not_vllm";
}

LoadBoard::LoadBoard(std::uint32_t endpoints) : n_(endpoints), cells_(std::make_unique<Cell[]>(endpoints)) {}

void LoadBoard::publish(std::uint32_t i, const VllmLoad& l) {
  seq_ = seq_ % 16383 + 1;  // 1..16383: 0 means "no scrape"
  const std::uint64_t running = std::min<std::uint32_t>(l.running, 0xfffff);
  const std::uint64_t waiting = std::min<std::uint32_t>(l.waiting, 0xfffff);
  const auto kv = static_cast<std::uint64_t>(std::clamp(std::lround(l.kv_usage * 1000), 0L, 1000L));
  cells_[i].packed.store(std::uint64_t{seq_} << 50 | running << 30 | waiting << 10 | kv, std::memory_order_relaxed);
}

void LoadBoard::clear(std::uint32_t i) { cells_[i].packed.store(0, std::memory_order_relaxed); }

}  // namespace weir::routing
