#include "routing/health.hpp"

#include <algorithm>

#include "core/saturating.hpp"

namespace weir::routing {

std::string_view open_cause_label(OpenCause c) {
  switch (c) {
    case OpenCause::connect:
      return "connect";
    case OpenCause::failures:
      return "failures";
    case OpenCause::ttft:
      return "ttft";
    case OpenCause::probe:
      return "probe";
    case OpenCause::trial:
      return "half_open_failure";
    case OpenCause::none:
    case OpenCause::count_:
      break;
  }
  return "none";
}

std::string_view health_state_label(HealthState s) {
  switch (s) {
    case HealthState::open:
      return "open";
    case HealthState::half_open:
      return "half_open";
    case HealthState::closed:
    case HealthState::count_:
      break;
  }
  return "closed";
}

HealthPolicy HealthPolicy::of(const core::PoolConfig& pc) {
  HealthPolicy p;
  p.open_for = pc.eject_for;
  p.max_open_for = pc.breaker.enabled && pc.breaker.max_open_for.count() > 0 ? Clock::duration(pc.breaker.max_open_for)
                                                                             : Clock::duration(pc.eject_for * 16);
  p.failures = pc.outlier.consecutive_failures;
  p.half_open_trials = pc.breaker.enabled ? pc.breaker.half_open_trials : 0;
  p.unhealthy_after = pc.health.unhealthy_after;
  return p;
}

Transition EndpointHealth::reopen(Clock::time_point now, const HealthPolicy& p, OpenCause cause) {
  const bool was_open = open_ && now < open_until_;
  if (trips_ < 32) ++trips_;
  // open_for · 2^(trips - 1), at most max_open_for.
  auto period = p.open_for;
  for (std::uint32_t k = 1; k < trips_ && period < p.max_open_for; ++k) period *= 2;
  period = std::min(period, p.max_open_for);
  open_until_ = was_open ? std::max(open_until_, now + period) : now + period;
  if (!was_open) opened_at_ = now;
  open_ = true;
  cause_ = cause;
  failures_ = 0;
  return was_open ? Transition::none : Transition::opened;
}

Transition EndpointHealth::on_answer(bool failed, bool trial, Clock::time_point now, const HealthPolicy& p,
                                     bool may_open, Clock::time_point sent) {
  if (trial) end_trial();
  const HealthState s = state(now, p);
  if (s == HealthState::open) return Transition::none;  // sent before it opened: the period runs on
  // Half-open, an answer to a request sent before it opened neither closes it (no trial went) nor reopens it.
  if (open_ && !trial && sent != Clock::time_point{} && sent < opened_at_) return Transition::none;
  if (!failed) {
    failures_ = 0;
    if (!open_) return Transition::none;
    // The first good answer since it was ejected closes it: that is its
    // recovery (weir_upstream_recoveries_total), with a breaker (half-open:
    // the trial answered) or without one (the period had ended, or a
    // connection ended it: on_connected). The doubling is forgotten.
    open_ = false;
    trips_ = 0;
    return Transition::closed;
  }
  if (s == HealthState::half_open) return reopen(now, p, OpenCause::trial);
  if (p.failures == 0 || ++failures_ < p.failures) return Transition::none;
  failures_ = 0;
  if (!may_open) return Transition::none;
  return reopen(now, p, OpenCause::failures);
}

Transition EndpointHealth::on_connect_failure(Clock::time_point now, const HealthPolicy& p) {
  return reopen(now, p, OpenCause::connect);
}

Transition EndpointHealth::on_connected(const HealthPolicy& p) {
  if (p.breaker() || !open_ || cause_ != OpenCause::connect) return Transition::none;
  // Without a breaker a connection that opens ends a refusal's ejection
  // (the endpoint was tried because every one was ejected, or its period
  // ended): its period is over, so picks use it in full again; it stays
  // marked open until its answer, whose good one is the recovery (on_answer).
  open_until_ = Clock::time_point{};
  trips_ = 0;
  return Transition::none;
}

Transition EndpointHealth::open(Clock::time_point now, const HealthPolicy& p, OpenCause cause) {
  return reopen(now, p, cause);
}

Transition EndpointHealth::on_probe(bool ok, Clock::time_point now, Clock::time_point held_until,
                                    const HealthPolicy& p) {
  if (ok) {
    failed_probes_ = 0;
    if (!probe_down_) return Transition::none;
    probe_down_ = false;
    if (open_ && cause_ == OpenCause::probe) {
      if (p.breaker()) {
        open_until_ = std::min(open_until_, now);  // half-open: the trials decide
        return Transition::none;                   // (the trial that closes it is the recovery, counted once)
      } else {
        open_ = false;
        trips_ = 0;
      }
    }
    return Transition::closed;
  }
  if (++failed_probes_ < p.unhealthy_after) return Transition::none;
  // Probes that find an endpoint already open (its breaker's, say) keep it
  // open, now until a probe passes: no second opening (one outage is one
  // ejection in weir_upstream_ejections_total), as reopen() counts none.
  const bool changed = !probe_down_ && !(open_ && now < open_until_);
  probe_down_ = true;
  open_until_ = open_ && now < open_until_ ? std::max(open_until_, held_until) : held_until;
  open_ = true;
  cause_ = OpenCause::probe;
  failures_ = 0;
  return changed ? Transition::opened : Transition::none;
}

void EndpointHealth::carry(const EndpointHealth& old, bool probes) {
  *this = old;
  trials_ = 0;
  if (!probes) {
    failed_probes_ = 0;
    probe_down_ = false;
  }
}

TtftOutliers::TtftOutliers(std::uint32_t endpoints, double factor, std::uint32_t min_samples)
    : windows_(endpoints), factor_(factor), min_samples_(std::clamp<std::uint32_t>(min_samples, 1, kWindow)) {
  medians_.reserve(endpoints);
}

bool TtftOutliers::add(std::uint32_t i, std::uint32_t ttft_us, std::uint32_t judged) {
  if (i >= windows_.size()) return false;
  Window& w = windows_[i];
  w.us[w.next] = ttft_us;
  w.next = (w.next + 1) % kWindow;
  if (w.count < kWindow) ++w.count;
  if (w.count < min_samples_) return false;
  update_median(w);
  medians_.clear();
  for (const auto& o : windows_)
    if (o.median != 0) medians_.push_back(o.median);
  if (medians_.size() < std::max<std::uint32_t>(judged, 2)) return false;
  const auto pm = medians_.begin() + static_cast<std::ptrdiff_t>((medians_.size() - 1) / 2);
  std::nth_element(medians_.begin(), pm, medians_.end());
  return static_cast<double>(w.median) >= factor_ * static_cast<double>(*pm);
}

void TtftOutliers::update_median(Window& w) const {
  if (w.count < min_samples_) {
    w.median = 0;
    return;
  }
  std::array<std::uint32_t, kWindow> tmp = w.us;     // the first w.count are the samples
  const auto mid = tmp.begin() + (w.count - 1) / 2;  // the lower median
  std::nth_element(tmp.begin(), mid, tmp.begin() + w.count);
  w.median = std::max<std::uint32_t>(*mid, 1);
}

void TtftOutliers::clear(std::uint32_t i) {
  if (i < windows_.size()) windows_[i] = Window{};
}

void TtftOutliers::adopt(std::uint32_t i, const TtftOutliers& old, std::uint32_t j) {
  if (i >= windows_.size() || j >= old.windows_.size()) return;
  windows_[i] = old.windows_[j];
  update_median(windows_[i]);
}

HealthBoard::HealthBoard(std::uint32_t endpoints, std::uint32_t workers)
    : endpoints_(endpoints),
      workers_(std::max<std::uint32_t>(workers, 1)),
      cells_(std::make_unique<std::atomic<std::uint64_t>[]>(std::size_t{endpoints_} * workers_)) {
  for (std::size_t i = 0; i < std::size_t{endpoints_} * workers_; ++i) cells_[i].store(0, std::memory_order_relaxed);
}

std::uint64_t HealthBoard::pack(const EndpointHealth& h) {
  if (!h.is_open()) return 0;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(h.open_until().time_since_epoch()).count();
  const std::uint64_t until = ms <= 0 ? 0 : std::min<std::uint64_t>(static_cast<std::uint64_t>(ms), (1ull << 60) - 1);
  return 1ull << 63 | std::uint64_t{static_cast<std::uint8_t>(h.cause()) & 7u} << 60 | until;
}

void HealthBoard::publish(std::uint32_t endpoint, std::uint32_t worker, const EndpointHealth& h) {
  if (endpoint >= endpoints_ || worker >= workers_) return;
  cells_[std::size_t{endpoint} * workers_ + worker].store(pack(h), std::memory_order_relaxed);
}

HealthState HealthBoard::state(std::uint32_t endpoint, std::uint32_t worker, Clock::time_point now,
                               const HealthPolicy& p) const {
  if (endpoint >= endpoints_ || worker >= workers_) return HealthState::closed;
  const std::uint64_t v = cells_[std::size_t{endpoint} * workers_ + worker].load(std::memory_order_relaxed);
  if ((v >> 63) == 0) return HealthState::closed;
  const Clock::time_point until{core::saturating_cast<Clock::duration>(
      std::chrono::milliseconds(static_cast<std::int64_t>(v & ((1ull << 60) - 1))))};
  if (now < until) return HealthState::open;
  return p.breaker() ? HealthState::half_open : HealthState::closed;
}

OpenCause HealthBoard::cause(std::uint32_t endpoint, std::uint32_t worker) const {
  if (endpoint >= endpoints_ || worker >= workers_) return OpenCause::none;
  const std::uint64_t v = cells_[std::size_t{endpoint} * workers_ + worker].load(std::memory_order_relaxed);
  return static_cast<OpenCause>((v >> 60) & 7u);
}

bool HealthBoard::available(std::uint32_t endpoint, Clock::time_point now, const HealthPolicy& p) const {
  for (std::uint32_t w = 0; w < workers_; ++w)
    if (state(endpoint, w, now, p) != HealthState::open) return true;
  return false;
}

std::uint32_t HealthBoard::available_endpoints(Clock::time_point now, const HealthPolicy& p) const {
  std::uint32_t n = 0;
  for (std::uint32_t e = 0; e < endpoints_; ++e) n += available(e, now, p) ? 1u : 0u;
  return n;
}

}  // namespace weir::routing
