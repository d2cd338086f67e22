// The x-request-id of each upstream request one client request (or one
// micro-batch) sends: its own id for the first, the id + "-N" for the N+1th
// (a retry, a failover, a fallback). vLLM takes the header as its engine's
// request id, and one id must never run twice there: an attempt Weir gave
// up on may still run until its abort is processed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weir::core {

struct AttemptIds {
  std::uint32_t sends = 0;  // upstream requests sent so far
  std::string latest;       // the latest's id when it is not the base (sends > 1)

  // The id of the next upstream request, made from `base` (valid until the
  // next call, or as long as `base` for the first).
  std::string_view next(std::string_view base) {
    if (sends++ == 0) return base;
    latest.assign(base);
    latest += '-';
    latest += std::to_string(sends - 1);
    return latest;
  }
  // The id the latest upstream request carried ("" before the first).
  std::string_view current(std::string_view base) const {
    return sends > 1 ? std::string_view(latest) : sends ? base : "";
  }
  void clear() {
    sends = 0;
    latest.clear();
  }
};

}  // namespace weir::core
