// Saturating conversions into std::chrono durations and time points.
//
// std::chrono::duration_cast is undefined behaviour when the value does not
// fit the target: a double out of the integer's range (C++20 [conv.fpint]),
// or an integer that overflows when scaled to finer units. Weir's clocks count
// int64 nanoseconds, so anything past about 9.22e9 s (year 2262) overflows
// them, and peers send such values: a JWT's exp of 253402300799 (9999-12-31,
// a common "never expires"), a Retry-After of 10^18 seconds, a Redis TTL.
// Every conversion of an outside number of seconds or milliseconds into a
// duration or a time point goes through here instead.
#pragma once

#include <chrono>
#include <cmath>
#include <limits>
#include <ratio>
#include <type_traits>
#include <utility>

namespace weir::core {

// `d` in `To`'s units (a std::chrono::duration with an integer count),
// truncated toward zero as duration_cast does, and saturated at To::min() and
// To::max() where it does not fit: +inf and every value past the range give
// To::max(), -inf and below give To::min(), NaN gives To::zero(). `d`'s count
// may be integer (signed or unsigned, any width) or floating point; the units
// are `d`'s and `To`'s own (so seconds, milliseconds, ... as their periods say).
// Example: saturating_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(1e19))
// is nanoseconds::max(), where duration_cast is undefined.
template <class To, class Rep, class Period>
constexpr To saturating_cast(std::chrono::duration<Rep, Period> d) noexcept {
  using R = typename To::rep;
  static_assert(std::is_integral_v<R> && std::is_signed_v<R>, "To must count in a signed integer");
  using F = std::ratio_divide<Period, typename To::period>;  // one unit of d in units of To
  constexpr R kMax = std::numeric_limits<R>::max();
  constexpr R kMin = std::numeric_limits<R>::min();
  if constexpr (std::is_floating_point_v<Rep>) {
    const long double x = static_cast<long double>(d.count()) * F::num / F::den;
    if (std::isnan(x)) return To::zero();
    // kMax as a floating value may round up to 2^63 (a long double as wide as
    // a double): at or past it is out of range; kMin = -2^63 is exact.
    if (x >= static_cast<long double>(kMax)) return To::max();
    if (x <= static_cast<long double>(kMin)) return To::min();
    return To(static_cast<R>(x));
  } else if constexpr (F::den == 1) {  // to finer (or the same) units: a multiplication that may overflow
    const Rep n = d.count();
    if (std::cmp_greater(n, kMax / F::num)) return To::max();
    if (std::cmp_less(n, kMin / F::num)) return To::min();
    return To(static_cast<R>(static_cast<R>(n) * F::num));
  } else if constexpr (F::num == 1) {  // to coarser units: a division, out of range only for a wider count
    const auto q = d.count() / F::den;
    if (std::cmp_greater(q, kMax)) return To::max();
    if (std::cmp_less(q, kMin)) return To::min();
    return To(static_cast<R>(q));
  } else {  // neither divides the other (not among Weir's units): through long double
    return saturating_cast<To>(std::chrono::duration<long double, Period>(d.count()));
  }
}

// `t + d` for a time point `t` of any clock and any duration `d` (units as
// their types say), saturated at the time point's min() and max() instead of
// overflowing: a deadline or expiry that far out is "never" (and that far
// back "always passed"). A NaN `d` adds nothing.
template <class Clock, class Dur, class Rep, class Period>
constexpr std::chrono::time_point<Clock, Dur> saturating_add(std::chrono::time_point<Clock, Dur> t,
                                                             std::chrono::duration<Rep, Period> d) noexcept {
  using TP = std::chrono::time_point<Clock, Dur>;
  using R = typename Dur::rep;
  const Dur step = saturating_cast<Dur>(d);
  const R base = t.time_since_epoch().count();
  if (step == Dur::max() || step == Dur::min()) {
    // `d` alone is out of range, and `t` may bring it back in: summed in floating point (to a unit or so).
    using F = std::ratio_divide<Period, typename Dur::period>;
    const long double sum = static_cast<long double>(base) + static_cast<long double>(d.count()) * F::num / F::den;
    return TP(saturating_cast<Dur>(std::chrono::duration<long double, typename Dur::period>(sum)));
  }
  const R s = step.count();
  if (s > 0 && base > std::numeric_limits<R>::max() - s) return TP::max();
  if (s < 0 && base < std::numeric_limits<R>::min() - s) return TP::min();
  return TP(Dur(base + s));
}

}  // namespace weir::core
