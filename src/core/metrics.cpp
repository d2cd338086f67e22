#include "core/metrics.hpp"

#include <algorithm>
#include <array>
#include <bit>

#include <fmt/format.h>

#include "core/json_text.hpp"

namespace weir::core {

Histogram::Histogram(std::span<const std::int64_t> bounds_us) : bounds_(bounds_us), counts_(bounds_us.size() + 1, 0) {}

void Histogram::observe_us(std::int64_t us) {
  if (us < 0) us = 0;
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), us);
  ++counts_[static_cast<std::size_t>(it - bounds_.begin())];
  ++count_;
  sum_us_ += static_cast<std::uint64_t>(us);
}

void Histogram::merge(const Histogram& o) {
  if (counts_.size() != o.counts_.size()) {
    if (!counts_.empty() || o.counts_.empty()) return;
    bounds_ = o.bounds_;
    counts_.assign(o.counts_.size(), 0);
  }
  for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
  count_ += o.count_;
  sum_us_ += o.sum_us_;
}

std::span<const std::int64_t> latency_buckets_us() {
  static constexpr std::array<std::int64_t, 22> b = {
      25,        50,         100,        250,        500,        1'000,     2'500,     5'000,
      10'000,    25'000,     50'000,     100'000,    250'000,    500'000,   1'000'000, 2'500'000,
      5'000'000, 10'000'000, 20'000'000, 30'000'000, 45'000'000, 60'000'000};
  return b;
}

std::span<const std::int64_t> added_latency_buckets_us() {
  static constexpr std::array<std::int64_t, 18> b = {
      5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1'000, 2'500, 5'000, 10'000, 25'000, 50'000, 100'000, 1'000'000};
  return b;
}

std::span<const std::int64_t> ttft_buckets_us() {
  static constexpr auto b = [] {
    std::array<std::int64_t, 2 + 40 + 17> a{};
    std::size_t i = 0;
    a[i++] = 1'000;
    a[i++] = 2'500;
    for (std::int64_t ms = 5; ms <= 200; ms += 5) a[i++] = ms * 1'000;
    for (std::int64_t ms : {250, 300, 400, 500, 750, 1'000, 1'500, 2'000, 3'000, 5'000, 7'500, 10'000, 15'000, 20'000,
                            30'000, 45'000, 60'000})
      a[i++] = ms * 1'000;
    return a;
  }();
  return b;
}

std::span<const std::int64_t> itl_buckets_us() {
  static constexpr std::array<std::int64_t, 36> b = {
      250,     500,       1'000,     2'000,     3'000,      4'000,      5'000,      6'000,      7'000,
      8'000,   9'000,     10'000,    12'000,    14'000,     16'000,     18'000,     20'000,     25'000,
      30'000,  40'000,    50'000,    75'000,    100'000,    150'000,    200'000,    300'000,    500'000,
      750'000, 1'000'000, 2'000'000, 5'000'000, 10'000'000, 20'000'000, 30'000'000, 45'000'000, 60'000'000};
  return b;
}

CounterMap::CounterMap(std::size_t capacity) {
  std::size_t n = 16;
  while (n < capacity) n *= 2;
  keys_.assign(n, kEmpty);
  values_.assign(n, 0);
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(n));
}

std::size_t CounterMap::slot_of(std::uint64_t key) const {
  // Fibonacci hashing: packed label tuples differ in few bits, which the multiply spreads.
  std::size_t i = static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_);
  const std::size_t mask = keys_.size() - 1;
  while (keys_[i] != key && keys_[i] != kEmpty) i = (i + 1) & mask;
  return i;
}

void CounterMap::add(std::uint64_t key, std::uint64_t n) {
  std::size_t i = slot_of(key);
  if (keys_[i] == kEmpty) {
    if (2 * (size_ + 1) > keys_.size()) {
      grow();
      i = slot_of(key);
    }
    keys_[i] = key;
    ++size_;
  }
  values_[i] += n;
}

std::uint64_t CounterMap::get(std::uint64_t key) const {
  const std::size_t i = slot_of(key);
  return keys_[i] == key ? values_[i] : 0;
}

void CounterMap::grow() {
  std::vector<std::uint64_t> keys(keys_.size() * 2, kEmpty), values(keys_.size() * 2, 0);
  keys.swap(keys_);
  values.swap(values_);
  --shift_;
  for (std::size_t j = 0; j < keys.size(); ++j) {
    if (keys[j] == kEmpty) continue;
    const std::size_t i = slot_of(keys[j]);
    keys_[i] = keys[j];
    values_[i] = values[j];
  }
}

void CounterMap::merge(const CounterMap& o) {
  for (std::size_t j = 0; j < o.keys_.size(); ++j)
    if (o.keys_[j] != kEmpty) add(o.keys_[j], o.values_[j]);
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> CounterMap::sorted() const {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  out.reserve(size_);
  for (std::size_t j = 0; j < keys_.size(); ++j)
    if (keys_[j] != kEmpty) out.emplace_back(keys_[j], values_[j]);
  std::sort(out.begin(), out.end());
  return out;
}

void PromWriter::header(std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void PromWriter::sample(std::string_view name, std::string_view labels, double value) {
  if (labels.empty())
    fmt::format_to(std::back_inserter(out_), "{} {}\n", name, value);
  else
    fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, labels, value);
}

void PromWriter::sample(std::string_view name, std::string_view labels, std::uint64_t value) {
  if (labels.empty())
    fmt::format_to(std::back_inserter(out_), "{} {}\n", name, value);
  else
    fmt::format_to(std::back_inserter(out_), "{}{{{}}} {}\n", name, labels, value);
}

void PromWriter::histogram(std::string_view name, std::string_view labels, const Histogram& h) {
  const std::string_view sep = labels.empty() ? "" : ",";
  std::uint64_t cum = 0;
  const auto bounds = h.bounds_us();
  const auto& counts = h.counts();
  for (std::size_t i = 0; i < bounds.size() && i < counts.size(); ++i) {
    cum += counts[i];
    fmt::format_to(std::back_inserter(out_), "{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep,
                   static_cast<double>(bounds[i]) / 1e6, cum);
  }
  fmt::format_to(std::back_inserter(out_), "{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, h.count());
  if (labels.empty()) {
    fmt::format_to(std::back_inserter(out_), "{}_sum {}\n{}_count {}\n", name, static_cast<double>(h.sum_us()) / 1e6,
                   name, h.count());
  } else {
    fmt::format_to(std::back_inserter(out_), "{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels,
                   static_cast<double>(h.sum_us()) / 1e6, name, labels, h.count());
  }
}

std::string escape_label(std::string_view v) {
  // A label value is UTF-8 (the Prometheus text format): a name of raw bytes from the configuration must not
  // make the whole scrape unreadable; an ill-formed byte becomes U+FFFD.
  std::string s;
  s.reserve(v.size());
  while (!v.empty()) {
    const char c = v.front();
    const std::size_t n = utf8_sequence_length(v, 0);
    if (n == 0) {
      s += "\xEF\xBF\xBD";
      v.remove_prefix(1);
      continue;
    }
    if (c == '\\')
      s += "\\\\";
    else if (c == '"')
      s += "\\\"";
    else if (c == '\n')
      s += "\\n";
    else
      s.append(v.substr(0, n));
    v.remove_prefix(n);
  }
  return s;
}

}  // namespace weir::core
