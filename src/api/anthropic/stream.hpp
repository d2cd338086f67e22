// OpenAI/vLLM chat-completion chunks → Anthropic Messages streaming events
// (Anthropic API reference: "Streaming Messages"): message_start and one
// `event: ping` (data {"type": "ping"}, as Anthropic writes it), then per
// content block content_block_start / content_block_delta (text_delta,
// thinking_delta (only when the request asked for thinking),
// input_json_delta: arguments read by classify_arguments, none ({}) gives no
// delta, JSON that is no object is given at the block's end as
// {"_raw": text}) / content_block_stop with dense
// indices 0, 1, 2…, then one message_delta (stop_reason, usage) and one
// message_stop. Each event is `event: <type>\ndata: <json>\n\n`. A delta's
// content is a string or a list of parts (Mistral's API: text parts are
// text_delta, thinking parts thinking_delta, others skipped: json_dom.hpp,
// for_each_content).
// A tool_use block's start waits until its name is whole
// (ToolCallStream::start_ready). Parallel tool calls whose deltas interleave: the first streams, the others
// are held (ToolCallStream, up to `held_limit` bytes) and given whole, in
// order, when the tool calls end. A call whose arguments are no JSON text
// when it ends fails the stream (an error event), unless it is the last
// block and finish_reason was "length" (the call the limit cut: stop_reason
// max_tokens says its input was cut; an earlier call's was whole). A failed
// finish_reason (api::Finish::failed: vLLM's "abort", "error", "repetition",
// a value no mapping knows) ends it with an error event (api_error), never a
// message_delta with end_turn.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api/tool_call_stream.hpp"
#include "api/usage.hpp"

namespace weir::api::anthropic {

class StreamTranslator {
 public:
  // Before a stream: `fallback_id` (Weir's request id; must outlive the
  // stream) makes the message id ("msg_" + it) when the upstream's chunks
  // carry none (or just "chatcmpl-"), so ids stay unique per request;
  // `held_limit` caps the bytes of tool calls held (server.max_response);
  // `with_thinking`: the request's thinking.type is enabled or adaptive, so
  // the upstream's reasoning (reasoning_content, `reasoning`, a content list's
  // thinking parts) is given as thinking blocks; without it, it is left out,
  // as Anthropic gives thinking blocks only when asked.
  void reset(std::string_view fallback_id = {}, std::size_t held_limit = kHeldLimit, bool with_thinking = true);

  // The default cap of held tool-call bytes: server.max_response's default.
  static constexpr std::size_t kHeldLimit = std::size_t{256} << 20;

  // Translates the `data` of one upstream SSE event (a chat.completion.chunk,
  // the final usage chunk, an in-stream {"error"}, or [DONE]); appends the
  // Anthropic events it gives to `out` (none, or several). After the stream
  // ended for the client (message_stop or an error event), everything is
  // swallowed: a repeated finish or usage chunk never gives a second
  // terminal event, and [DONE] never reaches the client.
  void on_data(std::string_view data, std::string& out);

  // The upstream's body ended normally: appends what the client still needs
  // (message_delta and message_stop after a finish_reason; otherwise an
  // error event: the stream was cut short). Nothing once ended().
  void finish(std::string& out);

  // Appends `event: error` with {"type":"error","error":{"type":error_type(status),
  // "message"}} unless the stream already ended for the client; ends it.
  void fail(int status, std::string_view message, std::string& out);

  // message_stop or an error event went out: the stream is over for the client.
  bool ended() const { return ended_; }
  // It ended with fail(): the upstream's error or a chunk that was no JSON object (or Weir's failure).
  bool failed() const { return failed_; }
  // The finish_reason the upstream ended the generation with when it is a failed one (api::Finish::failed:
  // vLLM's "abort", "error", "repetition", an unknown value), cut to 64 bytes; empty otherwise. The stream
  // then fails where it would have ended (after the usage chunk, at [DONE], or at finish()), 502.
  std::string_view unfinished() const { return unfinished_; }

 private:
  enum class Block : std::uint8_t { none, text, thinking, tool };

  void start(std::string_view id, std::string_view model, std::string& out);
  void open(Block kind, std::string& out);  // a tool_use block: the call calls_[tool_call_]
  void close(std::string& out);
  // Closes the open block and gives every held tool call (each start, its
  // arguments, stop); false when the stream failed doing so.
  bool close_all(std::string& out);
  // The held content_block_start of the open tool_use block, if not sent, and the arguments held with it.
  void start_tool(std::string& out);
  void tool_arguments(std::string_view args, std::string& out);
  void delta(std::string_view type, std::string_view field, std::string_view text, std::string& out);
  void terminate(std::string& out);

  bool started_ = false;
  bool ended_ = false;
  bool failed_ = false;
  bool finished_ = false;   // a finish_reason arrived
  std::string unfinished_;  // a failed finish_reason that arrived (unfinished())
  bool has_usage_ = false;
  Block open_ = Block::none;
  std::uint32_t next_index_ = 0;  // the next content block's index
  bool truncated_ = false;        // the finish_reason was "length"
  ToolCallStream calls_;          // the message's tool calls
  std::size_t tool_call_ = 0;     // calls_' position of the open tool_use block's call
  std::string_view fallback_id_;  // Weir's request id
  std::size_t held_limit_ = kHeldLimit;
  std::string tool_text_;  // the open tool_use block's object arguments so far (checked at its end)
  // The open tool_use block's arguments: not begun yet, a JSON object
  // (streamed as they come), or other text (held in tool_raw_).
  using ToolArgs = ArgumentsForm;
  ToolArgs tool_args_ = ToolArgs::none;
  std::string tool_raw_;
  // A tool_use block's start is held until its name is whole (ToolCallStream::start_ready, or the block
  // closes): the name may come in pieces, and Anthropic's grammar says it once, in content_block_start.
  bool tool_start_pending_ = false;
  bool with_thinking_ = true;  // the reasoning is given as thinking blocks (reset())
  bool refused_ = false;       // the upstream's text was a refusal (delta.refusal): stop_reason "refusal"
  std::string msg_id_;         // "msg_…"
  std::string stop_reason_;
  std::string stop_sequence_;
  Usage usage_;
  std::string scratch_;
};

}  // namespace weir::api::anthropic
