// OpenAI/vLLM chat-completion chunks → OpenAI Responses streaming events
// (OpenAI API reference: "Responses streaming"; the openai SDK's
// types/responses/*_event.py): response.created, response.in_progress, then
// per output item response.output_item.added, its content part and deltas
// (output_text, reasoning_text, function_call_arguments), their .done events
// and response.output_item.done, then one terminal response.completed,
// response.incomplete or response.failed carrying the whole response.
// Each event is `event: <type>\ndata: <json>\n\n`, with `sequence_number`
// 0, 1, 2… in `data`; there is no [DONE]. A delta's content is a string or a
// list of parts (Mistral's API: text parts to the message, thinking parts to
// reasoning, others skipped: json_dom.hpp, for_each_content).
// A function_call item's output_item.added waits until its name is whole
// (ToolCallStream::start_ready); its arguments are read as the Anthropic
// translator reads them (classify_arguments). Parallel tool calls whose
// deltas interleave: the first streams, the others
// are held (ToolCallStream, up to `held_limit` bytes) and given whole, in
// order, when the tool calls end. A call whose arguments are no JSON text
// when it ends gives response.failed, unless it is the last item and
// finish_reason was "length" (the call the limit cut: the response and that
// item are then incomplete, reason max_output_tokens). A failed finish_reason
// (api::Finish::failed: vLLM's "abort", "error", "repetition", a value no
// mapping knows) ends it with response.failed (error server_error), never
// response.completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/responses/response.hpp"
#include "api/tool_call_stream.hpp"

namespace weir::api::responses {

// The usage a response that fails now is charged and logged with (the
// gateway's rule for a stream cut short: the prompt's estimate and one token
// per content event, raised to what the choices' own counts said), for a
// stream whose usage came only on its choices' chunks (continuous_usage_stats,
// or a server that puts it on its finish chunk): those are one choice's
// counts so far, not the bill. nullopt: the failed response is charged no
// usage (its `usage` is null). Asked once, as response.failed is written.
class FailedUsage {
 public:
  virtual std::optional<Usage> failed_usage() const = 0;

 protected:
  ~FailedUsage() = default;
};

class StreamTranslator {
 public:
  // Before a stream: `echo` (the request's members of the Response object,
  // request.hpp) must outlive the stream; `fallback_id` names the response
  // when the upstream fails before its first chunk (Weir's request id), and
  // `fallback_model` (the model the client asked for) is its model then.
  // The fallback id also names the response when the upstream's chunks carry
  // no id (or just "chatcmpl-"). `held_limit` caps the bytes of tool calls
  // held (server.max_response).
  void reset(std::string_view echo, std::string_view fallback_id, std::string_view fallback_model = {},
             std::size_t held_limit = kHeldLimit);

  // The default cap of held tool-call bytes: server.max_response's default.
  static constexpr std::size_t kHeldLimit = std::size_t{256} << 20;

  // Translates the `data` of one upstream SSE event (a chat.completion.chunk,
  // the final usage chunk, an in-stream {"error"}, or [DONE]); appends the
  // events it gives to `out` (none, or several). After the terminal event
  // everything is swallowed: a repeated finish or usage chunk never gives a
  // second one, and [DONE] never reaches the client.
  void on_data(std::string_view data, std::string& out);

  // The upstream's body ended normally: appends what the client still needs
  // (the open item's .done events and the terminal event after a
  // finish_reason; otherwise response.failed: the stream was cut short).
  // Nothing once ended().
  void finish(std::string& out);

  // Appends response.failed (error {code: server_error, message}), after
  // response.created when nothing went out yet, unless the stream already
  // ended for the client; ends it. `status` is Weir's or the upstream's.
  // Its usage: the upstream's total when it came; when only the choices'
  // chunks carried usage, what `charged_by` (charge_from()) says, when set.
  void fail(int status, std::string_view message, std::string& out);

  // After reset(): where response.failed's usage comes from when the
  // upstream's was per choice (FailedUsage). `f` outlives the stream; null: the choice's own.
  void charge_from(const FailedUsage* f) { charged_by_ = f; }

  // The terminal event went out: the stream is over for the client.
  bool ended() const { return ended_; }
  // It ended with fail(): the upstream's error or a chunk that was no JSON object (or Weir's failure).
  bool failed() const { return failed_; }
  // The finish_reason the upstream ended the generation with when it is a failed one (api::Finish::failed:
  // vLLM's "abort", "error", "repetition", an unknown value), cut to 64 bytes; empty otherwise. The stream
  // then fails where it would have ended (after the usage chunk, at [DONE], or at finish()), 502.
  std::string_view unfinished() const { return unfinished_; }

 private:
  void begin(std::string_view type, std::string& out);
  void start(std::string_view id, std::string_view model, std::int64_t created, std::string& out);
  void open(OutputItem::Kind kind, std::string& out, std::string_view call_id = {}, std::string_view name = {});
  void delta(std::string_view text, std::string& out);
  // The held output_item.added of the open function call, if not sent, and the arguments held with it.
  void start_call(std::string& out);
  void tool_arguments(std::string_view args, std::string& out);  // a piece of the open call's arguments
  // A function call is open: its item, or its call whose item waits for the whole name.
  bool in_function_call() const {
    return call_pending_ || (open_ && items_.back().kind == OutputItem::Kind::function_call);
  }
  void close(std::string& out);
  // Closes the open item and gives every held function call (added, its
  // arguments, done); false when the stream failed doing so.
  bool close_all(std::string& out);
  void append_item_ref(std::string& out) const;  // "item_id":…,"output_index":N
  void terminate(std::string& out);

  bool started_ = false;
  bool ended_ = false;
  bool failed_ = false;
  bool finished_ = false;   // a finish_reason arrived
  std::string unfinished_;  // a failed finish_reason that arrived (unfinished())
  bool open_ = false;       // items_.back() is open
  bool has_usage_ = false;
  bool usage_per_choice_ = false;  // usage_ came on a chunk with choices (not the usage-only chunk)
  const FailedUsage* charged_by_ = nullptr;
  std::uint64_t seq_ = 0;      // the next event's sequence_number
  bool truncated_ = false;     // the finish_reason was "length"
  ToolCallStream calls_;       // the response's function calls
  std::size_t tool_call_ = 0;  // calls_' position of the open function_call item's call
  // The open call's output_item.added is held until its name is whole (ToolCallStream::start_ready, or the
  // call closes): the name may come in pieces, and the added item names it.
  bool call_pending_ = false;
  // The open call's arguments: not begun yet, a JSON object (streamed as they come), or other text (held
  // in tool_raw_ to the item's end).
  using ToolArgs = ArgumentsForm;
  ToolArgs tool_args_ = ToolArgs::none;
  std::string tool_raw_;
  // The content chunk's logprobs.content entries (append_logprobs), for its output_text.delta; kept (its
  // capacity reused) from chunk to chunk.
  std::string chunk_logprobs_;
  std::int64_t created_ = 0;
  std::string_view echo_;
  std::string_view fallback_id_;
  std::string_view fallback_model_;
  std::string_view status_ = "in_progress";
  std::string_view incomplete_reason_;
  std::string base_id_;  // the upstream id without "chatcmpl-"
  std::string resp_id_;  // "resp_…"
  std::string model_;
  ResponseUsage usage_;
  std::vector<OutputItem> items_;
  // The reasoning items and the message (text or refusal) items opened so far: the next one's id suffix.
  std::size_t reasoning_items_ = 0;
  std::size_t message_items_ = 0;
};

}  // namespace weir::api::responses
