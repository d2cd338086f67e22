#include "core/metrics.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

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
  std::string s;
  s.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      s += "\\\\";
    else if (c == '"')
      s += "\\\"";
    else if (c == '\n')
      s += "\\n";
    else
      s += c;
  }
  return s;
}

}  // namespace weir::core
