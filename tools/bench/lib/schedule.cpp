#include "bench/lib/schedule.hpp"

#include <cmath>

namespace weir::bench {

Schedule::Schedule(Arrivals arrivals, double rate, std::uint32_t stride, std::uint32_t phase, std::uint64_t seed)
    : arrivals_(arrivals),
      period_ns_(1e9L / static_cast<long double>(rate)),
      stride_(stride == 0 ? 1 : stride),
      phase_(phase % (stride == 0 ? 1 : stride)),
      rng_(seed ^ (0x9e3779b97f4a7c15ULL * (phase + 1))) {
  if (arrivals_ == Arrivals::constant) {
    next_ns_ = compute_constant();
  } else {
    advance();  // the first arrival is one exponential gap after start
    index_ = 0;
  }
}

std::int64_t Schedule::compute_constant() const {
  const long double slot = static_cast<long double>(index_) * stride_ + phase_;
  return static_cast<std::int64_t>(std::llround(slot * period_ns_));
}

void Schedule::advance() {
  ++index_;
  if (arrivals_ == Arrivals::constant) {
    next_ns_ = compute_constant();
    return;
  }
  // Inverse-CDF exponential draw; 1 - u is in (0, 1], so log() is finite.
  double u = std::generate_canonical<double, 53>(rng_);
  if (u >= 1.0) u = std::nextafter(1.0, 0.0);  // libstdc++ may return 1.0 (LWG 2524)
  poisson_t_ += -std::log1p(-u) * period_ns_ * stride_;
  next_ns_ = static_cast<std::int64_t>(std::llround(poisson_t_));
}

Pacer::Pacer(Schedule schedule, std::int64_t start_ns, std::int64_t end_ns)
    : schedule_(std::move(schedule)), start_ns_(start_ns), end_ns_(end_ns) {}

std::optional<std::int64_t> Pacer::next_due() const {
  if (done_) return std::nullopt;
  const std::int64_t t = start_ns_ + schedule_.peek();
  if (t >= end_ns_) return std::nullopt;
  return t;
}

std::optional<Due> Pacer::poll(std::int64_t now_ns) {
  const auto t = next_due();
  if (!t) {
    done_ = true;
    return std::nullopt;
  }
  if (*t > now_ns) return std::nullopt;
  Due d{*t, now_ns - *t, schedule_.index()};
  schedule_.advance();
  ++released_;
  return d;
}

}  // namespace weir::bench
