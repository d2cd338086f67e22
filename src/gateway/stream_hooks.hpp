// What is done to each SSE event between the upstream and the client
// (DESIGN.md, respond phase: "a hook per event"). Fixed members, no
// allocation and no std::function per event: usage capture and the
// usage-chunk strip (api/openai/stream.hpp), the Anthropic Messages and
// OpenAI Responses translations (api/anthropic/stream.hpp,
// api/responses/stream.hpp), which rewrite every event instead of passing
// it through, and an Anthropic upstream's events, translated into chat
// chunks (api/anthropic/upstream_stream.hpp; then into Responses events
// for a Responses client) or observed as they pass to an Anthropic client;
// micro-batch demultiplexing plugs in here as a further member
// (docs/architecture.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "api/anthropic/response.hpp"
#include "api/anthropic/stream.hpp"
#include "api/anthropic/upstream_stream.hpp"
#include "api/finish_reason.hpp"
#include "api/openai/stream.hpp"
#include "api/responses/stream.hpp"
#include "http/sse.hpp"

namespace weir::gateway {

// The client's stream dialect, when it is not the upstream's.
enum class Translation : std::uint8_t { none, anthropic, responses };

// What the pool's endpoints speak (core::UpstreamType): OpenAI chat chunks
// (vLLM, hosted OpenAI-compatible APIs) or Anthropic's Messages events.
enum class UpstreamDialect : std::uint8_t { openai, anthropic };

class StreamHooks {
 public:
  // What a stream's hooks do, set once per stream by reset().
  struct Setup {
    bool strip_usage = false;              // Weir asked for the usage chunk on the client's behalf (OpenAI upstreams)
    std::uint32_t choices_per_prompt = 1;  // the request's n: how per-choice usage adds up (UsageHook)
    std::uint32_t prompts = 1;             // the request's prompts: when per-choice usage said them all (UsageHook)
    Translation client = Translation::none;
    UpstreamDialect upstream = UpstreamDialect::openai;
    bool include_usage = false;   // an OpenAI chat client asked for the usage chunk (Anthropic upstreams)
    std::int64_t created = 0;     // Unix seconds for chunks made from an Anthropic stream
    std::string_view echo;        // Responses: the request's members of the answer (must outlive the stream)
    std::string_view request_id;  // Responses: the id when the upstream fails before its first chunk
    std::string_view model;       // Responses: the model then
    // Translated streams: the cap on the bytes of parallel tool calls held (server.max_response).
    std::size_t held_limit = api::anthropic::StreamTranslator::kHeldLimit;
    bool thinking = false;  // Anthropic clients: the request asked for thinking blocks (RequestFields::thinking)
    // Responses: what a response.failed says it is charged when the upstream's usage was per choice.
    const api::responses::FailedUsage* failed_usage = nullptr;
  };

  // Before a stream starts: `strip_usage` when Weir asked for the usage
  // chunk on the client's behalf; `t` for a translated stream from an
  // OpenAI upstream. A Responses stream takes the request's `echo` (it must
  // outlive the stream) and the request id and model (api/responses/stream.hpp).
  void reset(bool strip_usage, Translation t = Translation::none, std::string_view echo = {},
             std::string_view request_id = {}, std::string_view model = {}) {
    reset(Setup{.strip_usage = strip_usage, .client = t, .echo = echo, .request_id = request_id, .model = model});
  }
  void reset(const Setup& s) {
    usage_.reset(s.strip_usage, s.choices_per_prompt, s.prompts);
    finish_.reset(s.choices_per_prompt <= 1 && s.prompts <= 1);
    const Mode m = mode_of(s.client, s.upstream);
    // The translators are made on the connection's first translated stream
    // and kept for its next: a plain stream carries a null pointer, not
    // their ~600 bytes (memory per open stream).
    if (m != Mode::plain && !tr_) tr_ = std::make_unique<Translators>();
    if (tr_) {
      if (m == Mode::anthropic || mode_ == Mode::anthropic)
        tr_->anthropic.reset(s.request_id, s.held_limit, s.thinking);
      if (s.client == Translation::responses || mode_ == Mode::responses || mode_ == Mode::responses_from_anthropic) {
        tr_->responses.reset(s.echo, s.request_id, s.model, s.held_limit);
        tr_->responses.charge_from(s.failed_usage);
      }
      if (s.upstream == UpstreamDialect::anthropic) {
        tr_->upstream.reset(s.client == Translation::responses || s.include_usage, s.created);
        tr_->passthrough.reset();
      }
    }
    mode_ = m;
    done_relayed_ = false;
    data_events_ = 0;
  }

  // True when events are rewritten or observed (translate()), not passed
  // through by on_event(): a client dialect other than the upstream's, or
  // an Anthropic upstream (whose usage is read differently).
  bool translating() const { return mode_ != Mode::plain; }
  // The upstream speaks Anthropic's Messages stream (a type: anthropic pool).
  bool anthropic_upstream() const { return upstream_dialect() == UpstreamDialect::anthropic; }
  // The parts of its usage the upstream said when it did not say it whole (api::PartialUsage): an Anthropic
  // upstream's prompt tokens as its message_start said them (input and cache tokens: real, not estimated),
  // once it came, whether or not the stream reached its final usage, and its output once a message_delta
  // said it; an OpenAI upstream's usage that left its prompt or completion count out (null), the other.
  // Nothing said when a count did not read (out of range: the estimate, not it).
  api::PartialUsage said_usage() const {
    if (mode_ == Mode::anthropic_passthrough) return tr_->passthrough.said_usage();
    if (mode_ == Mode::chat_from_anthropic || mode_ == Mode::responses_from_anthropic)
      return tr_->upstream.said_usage();
    return usage_.partial();
  }
  // The client's stream is OpenAI chat chunks (on_event(), or an Anthropic
  // upstream translated into them): an in-band failure is then
  // `data: {"error": …}` and `data: [DONE]` (gateway/phases fail()).
  bool openai_client() const { return mode_ == Mode::plain || mode_ == Mode::chat_from_anthropic; }

  // A translated stream: appends the client's events for the upstream event
  // `ev` to `out` (usage is read as on_event does). Returns true when it
  // appended any data event (an Anthropic stream passing through also
  // appends its comments, returning false).
  bool translate(const http::SseEvent& ev, std::string& out) {
    const std::size_t before = out.size();
    switch (mode_) {
      case Mode::anthropic_passthrough:
        // The client speaks the upstream's dialect: every byte as it came
        // (a comment too, though it is no data event).
        out += ev.raw;
        if (!ev.has_data) return false;
        tr_->passthrough.on_data(ev.data);
        if (tr_->passthrough.has_usage()) usage_.set(tr_->passthrough.usage());
        if (tr_->passthrough.usage_invalid()) usage_.mark_invalid();
        done_relayed_ = tr_->passthrough.ended();
        break;
      case Mode::chat_from_anthropic: {
        if (!ev.has_data) return false;
        ChatSink sink{out};
        tr_->upstream.on_data(ev.data, sink);
        after_upstream();
        done_relayed_ = tr_->upstream.ended();
        break;
      }
      case Mode::responses_from_anthropic: {
        if (!ev.has_data) return false;
        ResponsesSink sink{tr_->responses, out};
        tr_->upstream.on_data(ev.data, sink);
        after_upstream();
        done_relayed_ = tr_->responses.ended();
        break;
      }
      default:
        if (!ev.has_data) return false;  // upstream comments and blank blocks are not the client's
        if (!ev.is_done()) (void)usage_.on_data(ev.data);
        if (mode_ == Mode::responses) {
          tr_->responses.on_data(ev.data, out);
          done_relayed_ = tr_->responses.ended();
        } else {
          tr_->anthropic.on_data(ev.data, out);
          done_relayed_ = tr_->anthropic.ended();
        }
        break;
    }
    if (out.size() == before) return false;
    ++data_events_;
    return true;
  }
  // A translated stream's upstream body ended normally: the closing events.
  // Returns true when the answer was cut short (no finish, no message_stop):
  // the client was told so in its dialect, and the request failed upstream.
  bool finish(std::string& out) {
    bool cut = false;
    switch (mode_) {
      case Mode::responses:
        cut = !tr_->responses.ended();
        tr_->responses.finish(out);
        cut = cut && tr_->responses.failed();
        done_relayed_ = tr_->responses.ended();
        break;
      case Mode::anthropic:
        cut = !tr_->anthropic.ended();
        tr_->anthropic.finish(out);
        cut = cut && tr_->anthropic.failed();
        done_relayed_ = tr_->anthropic.ended();
        break;
      case Mode::anthropic_passthrough:
        // A body that ends before message_stop was cut short: say so, as Anthropic would.
        cut = !tr_->passthrough.ended();
        if (cut) append_anthropic_error(out, 502, "The upstream stream ended before the message was complete.");
        done_relayed_ = true;
        break;
      case Mode::chat_from_anthropic: {
        cut = !tr_->upstream.ended() && !tr_->upstream.finished();
        ChatSink sink{out};
        tr_->upstream.finish(sink);
        done_relayed_ = tr_->upstream.ended();
        break;
      }
      case Mode::responses_from_anthropic: {
        cut = !tr_->responses.ended();
        ResponsesSink sink{tr_->responses, out};
        tr_->upstream.finish(sink);
        tr_->responses.finish(out);
        cut = cut && tr_->responses.failed();
        done_relayed_ = tr_->responses.ended();
        break;
      }
      case Mode::plain:
        break;
    }
    return cut;
  }
  // A translated stream failed after its head went out, for a client whose
  // dialect has its own error event (!openai_client()): Anthropic's one
  // `event: error`, Responses' response.failed.
  void fail(int status, std::string_view message, std::string& out) {
    switch (mode_) {
      case Mode::responses:
      case Mode::responses_from_anthropic:
        tr_->responses.fail(status, message, out);
        done_relayed_ = tr_->responses.ended();
        return;
      case Mode::anthropic_passthrough:
        if (!tr_->passthrough.ended()) append_anthropic_error(out, status, message);
        done_relayed_ = true;
        return;
      case Mode::plain:
      case Mode::chat_from_anthropic:
        return;  // an OpenAI chat client: gateway/phases fail() writes its in-band error
      case Mode::anthropic:
        tr_->anthropic.fail(status, message, out);
        done_relayed_ = tr_->anthropic.ended();
        return;
    }
  }
  // For holding a stream's head until its first content (a fallback is
  // left): what the upstream event carries, in the upstream's dialect.
  api::openai::ChunkKind classify(const http::SseEvent& ev) const {
    if (!ev.has_data || ev.is_done()) return api::openai::ChunkKind::empty;
    return upstream_dialect() == UpstreamDialect::anthropic ? api::anthropic::classify_event(ev.data)
                                                            : api::openai::classify_chunk(ev.data);
  }

  // The first-token test of a stream that is not held: `content` or not, as classify() tells it, without a
  // parse of an OpenAI chunk (api::openai::looks_like_content: ~500 instructions, where a parse costs ~3,000
  // and the first token waits for one or two). An in-band error is error_event()'s; an invalid chunk is
  // relayed as it came either way.
  api::openai::ChunkKind first_token_kind(const http::SseEvent& ev) const {
    if (!ev.has_data || ev.is_done()) return api::openai::ChunkKind::empty;
    if (upstream_dialect() == UpstreamDialect::anthropic) return api::anthropic::classify_event(ev.data);
    return api::openai::looks_like_content(ev.data) ? api::openai::ChunkKind::content : api::openai::ChunkKind::empty;
  }

  // Whether the upstream event is an error in place of tokens or after
  // them: vLLM's and OpenAI's `data: {"error": …}` (older vLLM:
  // `{"object": "error", …}`), Anthropic's `{"type": "error", …}`. A test
  // of the event's first member, O(1) per event; only an event that begins
  // like one is parsed.
  bool error_event(const http::SseEvent& ev) const {
    if (!ev.has_data || ev.is_done() || !api::openai::begins_like_error(ev.data)) return false;
    return classify(ev) == api::openai::ChunkKind::error;
  }

  // A translated stream from an OpenAI upstream that its translator ended
  // with an error event for the client (Anthropic's `event: error`,
  // Responses' response.failed): the upstream's in-band error, or a chunk
  // that was no JSON object.
  bool translation_failed() const {
    switch (mode_) {
      case Mode::anthropic:
        return tr_->anthropic.failed();
      case Mode::responses:
      case Mode::responses_from_anthropic:
        return tr_->responses.failed();
      default:
        return false;
    }
  }

  // The failed finish_reason (api::Finish::failed) the stream carried, cut to 64 bytes; empty when none did:
  // for a translated stream from an OpenAI upstream, the one that ended it with its error event
  // (translation_failed()); for one relayed as it came (on_event()), the one that passed to the client in it
  // (api::FinishWatch), the generation failed all the same.
  std::string_view unfinished() const {
    switch (mode_) {
      case Mode::anthropic:
        return tr_->anthropic.unfinished();
      case Mode::responses:
        return tr_->responses.unfinished();
      case Mode::plain:
        return finish_.failed();
      default:
        return {};
    }
  }

  // Called for every complete event, in order. Returns true when `ev.raw`
  // goes to the client unchanged, false when it is dropped. After `[DONE]`
  // the stream is over for the client (the OpenAI wire contract; the
  // translators drop what follows their end as well): a second `[DONE]`,
  // late chunks and comments are dropped, their usage unread.
  bool on_event(http::SseEvent& ev) {
    if (done_relayed_) return false;
    if (!ev.has_data) return true;  // comments and blank blocks pass through
    if (ev.is_done()) {
      done_relayed_ = true;
    } else if (finish_.on_data(ev.data); !usage_.on_data(ev.data)) {
      return false;
    } else if (const auto edited = usage_.without_usage(ev.data, edited_data())) {
      // Usage Weir asked for, on a chunk with choices: the chunk without it (ev's views now point here).
      std::string& raw = edited_raw();
      raw.clear();
      http::append_sse_data(raw, *edited);
      ev.data = *edited;
      ev.raw = raw;
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
  // on_event()'s rewritten chunk and event: the thread's (a worker's), not the stream's, so an open stream carries
  // neither; their views are used up before the relay of one upstream read returns (a worker relays one at a time).
  static std::string& edited_data() {
    thread_local std::string s;
    return s;
  }
  static std::string& edited_raw() {
    thread_local std::string s;
    return s;
  }
  // The client's dialect × the upstream's.
  enum class Mode : std::uint8_t {
    plain,                     // OpenAI → OpenAI: on_event()
    anthropic,                 // OpenAI upstream → Anthropic client
    responses,                 // OpenAI upstream → Responses client
    anthropic_passthrough,     // Anthropic → Anthropic: passed as it came, usage read
    chat_from_anthropic,       // Anthropic upstream → OpenAI chat client
    responses_from_anthropic,  // Anthropic upstream → chat chunks → Responses client
  };
  static Mode mode_of(Translation client, UpstreamDialect upstream) {
    if (upstream == UpstreamDialect::anthropic)
      return client == Translation::anthropic   ? Mode::anthropic_passthrough
             : client == Translation::responses ? Mode::responses_from_anthropic
                                                : Mode::chat_from_anthropic;
    return client == Translation::anthropic   ? Mode::anthropic
           : client == Translation::responses ? Mode::responses
                                              : Mode::plain;
  }
  UpstreamDialect upstream_dialect() const {
    return mode_ == Mode::anthropic_passthrough || mode_ == Mode::chat_from_anthropic ||
                   mode_ == Mode::responses_from_anthropic
               ? UpstreamDialect::anthropic
               : UpstreamDialect::openai;
  }
  void after_upstream() {
    if (tr_->upstream.has_usage()) usage_.set(tr_->upstream.usage());
    if (tr_->upstream.usage_invalid()) usage_.mark_invalid();
  }
  static void append_anthropic_error(std::string& out, int status, std::string_view message) {
    out += "event: error\ndata: ";
    api::anthropic::append_error_json(out, status, message);
    out += "\n\n";
  }
  // The translated OpenAI chunks of an Anthropic stream, framed as SSE for a chat client.
  struct ChatSink final : api::anthropic::ChunkSink {
    explicit ChatSink(std::string& o) : out(o) {}
    void chunk(std::string_view data) override {
      out += "data: ";
      out += data;
      out += "\n\n";
    }
    std::string& out;
  };
  // … or fed to the Responses translator, as an OpenAI upstream's would be.
  struct ResponsesSink final : api::anthropic::ChunkSink {
    ResponsesSink(api::responses::StreamTranslator& t, std::string& o) : tr(t), out(o) {}
    void chunk(std::string_view data) override { tr.on_data(data, out); }
    api::responses::StreamTranslator& tr;
    std::string& out;
  };

  struct Translators {
    api::anthropic::StreamTranslator anthropic;
    api::responses::StreamTranslator responses;
    api::anthropic::UpstreamStreamTranslator upstream;
    api::anthropic::PassthroughObserver passthrough;
  };

  api::openai::UsageHook usage_;
  api::FinishWatch finish_;          // a plain stream's finish_reason (on_event())
  std::unique_ptr<Translators> tr_;  // set whenever mode_ is not plain
  Mode mode_ = Mode::plain;
  bool done_relayed_ = false;
  std::uint32_t data_events_ = 0;
};

}  // namespace weir::gateway
