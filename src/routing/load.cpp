#include "routing/load.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace weir::routing {

namespace {

// The value of a sample line after its name (and labels): `{...} 3.0 [ts]`
// or ` 3.0 [ts]`. nullopt on anything else.
std::optional<double> sample_value(std::string_view rest) {
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
    if (i >= rest.size()) return std::nullopt;
    rest.remove_prefix(i + 1);
  }
  if (rest.empty() || (rest.front() != ' ' && rest.front() != '\t')) return std::nullopt;
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  const auto end = rest.find_first_of(" \t\r");
  const std::string_view num = rest.substr(0, end);
  if (num.empty() || num.size() > 64) return std::nullopt;
  double v = 0;
  const auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (ec != std::errc() || p != num.data() + num.size() || !std::isfinite(v)) return std::nullopt;
  return v;
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
    if (line.size() < 6 || line[0] != 'v' || !line.starts_with("vllm:")) continue;
    struct Family {
      std::string_view name;
      int which;
    };
    for (const Family f : {Family{"vllm:num_requests_running", 0}, Family{"vllm:num_requests_waiting", 1},
                           Family{"vllm:kv_cache_usage_perc", 2}, Family{"vllm:gpu_cache_usage_perc", 3}}) {
      if (!line.starts_with(f.name)) continue;
      const auto v = sample_value(line.substr(f.name.size()));
      if (!v) break;  // another family with this prefix, or a malformed line
      switch (f.which) {
        case 0:
          running += *v;
          any = true;
          break;
        case 1:
          waiting += *v;
          any = true;
          break;
        case 2:
          l.kv_usage = kv_new ? std::max(l.kv_usage, *v) : *v;
          kv_new = true;
          break;
        default:
          kv_old = have_kv_old ? std::max(kv_old, *v) : *v;
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
