// What is done to each SSE event between the upstream and the client
// (DESIGN.md, respond phase: "a hook per event"). Fixed members, no
// allocation and no std::function per event: usage capture and the
// usage-chunk strip (api/openai/stream.hpp), and the Anthropic Messages and
// OpenAI Responses translations (api/anthropic/stream.hpp,
// api/responses/stream.hpp), which rewrite every event instead of passing
// it through; micro-batch demultiplexing plugs in here
// as a further member (docs/architecture.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "api/anthropic/stream.hpp"
#include "api/openai/stream.hpp"
#include "api/responses/stream.hpp"
#include "http/sse.hpp"

namespace weir::gateway {

// The client's stream dialect, when it is not the upstream's.
enum class Translation : std::uint8_t { none, anthropic, responses };

class StreamHooks {
 public:
  // Before a stream starts: `strip_usage` when Weir asked for the usage
  // chunk on the client's behalf; `t` for a translated stream. A Responses
  // stream takes the request's `echo` (it must outlive the stream) and the
  // request id and model (api/responses/stream.hpp).
  void reset(bool strip_usage, Translation t = Translation::none, std::string_view echo = {},
             std::string_view request_id = {}, std::string_view model = {}) {
    usage_.reset(strip_usage);
    if (t == Translation::anthropic || translate_ == Translation::anthropic) anthropic_.reset();
    if (t == Translation::responses || translate_ == Translation::responses) responses_.reset(echo, request_id, model);
    translate_ = t;
    done_relayed_ = false;
    data_events_ = 0;
  }

  // True when events are translated (translate()), not passed through (on_event()).
  bool translating() const { return translate_ != Translation::none; }
  // A translated stream: appends the client's events for the upstream event
  // `ev` to `out` (usage is read as on_event does). Returns true when it
  // appended any.
  bool translate(const http::SseEvent& ev, std::string& out) {
    if (!ev.has_data) return false;  // upstream comments and blank blocks are not the client's
    const std::size_t before = out.size();
    if (!ev.is_done()) (void)usage_.on_data(ev.data);
    if (translate_ == Translation::responses) {
      responses_.on_data(ev.data, out);
      done_relayed_ = responses_.ended();
    } else {
      anthropic_.on_data(ev.data, out);
      done_relayed_ = anthropic_.ended();
    }
    if (out.size() == before) return false;
    ++data_events_;
    return true;
  }
  // A translated stream's upstream body ended normally: the closing events.
  void finish(std::string& out) {
    if (translate_ == Translation::responses) {
      responses_.finish(out);
      done_relayed_ = responses_.ended();
      return;
    }
    anthropic_.finish(out);
    done_relayed_ = anthropic_.ended();
  }
  // A translated stream failed after its head went out: Anthropic's one
  // `event: error`, Responses' response.failed.
  void fail(int status, std::string_view message, std::string& out) {
    if (translate_ == Translation::responses) {
      responses_.fail(status, message, out);
      done_relayed_ = responses_.ended();
      return;
    }
    anthropic_.fail(status, message, out);
    done_relayed_ = anthropic_.ended();
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

  // The upstream's `data: [DONE]` (Anthropic: message_stop or an error
  // event) went to the client's queue: the stream is complete for the client.
  bool done_relayed() const { return done_relayed_; }
  // Data events that went to the client ([DONE] included).
  std::uint32_t data_events() const { return data_events_; }
  const api::openai::UsageHook& usage() const { return usage_; }

 private:
  api::openai::UsageHook usage_;
  api::anthropic::StreamTranslator anthropic_;
  api::responses::StreamTranslator responses_;
  Translation translate_ = Translation::none;
  bool done_relayed_ = false;
  std::uint32_t data_events_ = 0;
};

}  // namespace weir::gateway
