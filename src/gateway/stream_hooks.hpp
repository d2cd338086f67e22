// What is done to each SSE event between the upstream and the client
// (DESIGN.md, respond phase: "a hook per event"). Fixed members, no
// allocation and no std::function per event: usage capture and the
// usage-chunk strip (api/openai/stream.hpp) today; Anthropic translation and
// micro-batch demultiplexing plug in here as further members
// (docs/architecture.md).
#pragma once

#include <cstdint>

#include "api/openai/stream.hpp"
#include "http/sse.hpp"

namespace weir::gateway {

class StreamHooks {
 public:
  // Before a stream starts: `strip_usage` when Weir asked for the usage
  // chunk on the client's behalf.
  void reset(bool strip_usage) {
    usage_.reset(strip_usage);
    done_relayed_ = false;
    data_events_ = 0;
  }

  // Called for every complete event, in order. Returns true when `ev.raw`
  // goes to the client unchanged, false when it is dropped.
  bool on_event(const http::SseEvent& ev) {
    if (!ev.has_data) return true;  // comments and blank blocks pass through
    if (ev.is_done()) {
      done_relayed_ = true;
    } else if (!usage_.on_data(ev.data)) {
      return false;
    }
    ++data_events_;
    return true;
  }

  // The upstream's `data: [DONE]` went to the client's queue: the stream is
  // complete for the client.
  bool done_relayed() const { return done_relayed_; }
  // Data events that went to the client ([DONE] included).
  std::uint32_t data_events() const { return data_events_; }
  const api::openai::UsageHook& usage() const { return usage_; }

 private:
  api::openai::UsageHook usage_;
  bool done_relayed_ = false;
  std::uint32_t data_events_ = 0;
};

}  // namespace weir::gateway
