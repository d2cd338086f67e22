// Anthropic's Messages API as the upstream, streaming (Anthropic API
// reference: "Streaming Messages"): its events (message_start,
// content_block_start / _delta / _stop, message_delta, message_stop, ping,
// error) translated into an OpenAI chat.completion.chunk stream (OpenAI API
// reference: "The chat completion chunk object"), or observed as they pass
// through to an Anthropic client. Mappings: docs/protocols.md ("Anthropic
// as the upstream").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "api/anthropic/upstream_response.hpp"
#include "api/openai/stream.hpp"
#include "api/usage.hpp"

namespace weir::api::anthropic {

// Where the translated OpenAI stream goes, one piece at a time: the data of
// a chat.completion.chunk, an in-band {"error": {...}}, or "[DONE]". A
// fixed object (no std::function): the gateway's sinks frame the data as
// SSE for a chat client, or feed it to the Responses translator.
class ChunkSink {
 public:
  virtual void chunk(std::string_view data) = 0;

 protected:
  ~ChunkSink() = default;
};

// Anthropic events → chat.completion.chunk data. One object per stream,
// reset() before each; no heap allocation per event once its buffers have
// grown (each event is parsed into a stack arena).
class UpstreamStreamTranslator {
 public:
  // Before a stream. `include_usage`: the client asked for the usage chunk
  // (stream_options.include_usage); `created`: Unix seconds for the chunks'
  // `created` (Anthropic sends none).
  void reset(bool include_usage, std::int64_t created);

  // Translates the `data` of one upstream SSE event; gives `sink` what the
  // client gets for it, in order:
  //   message_start        → the role chunk (delta {"role":"assistant","content":""})
  //   text_delta           → delta.content
  //   thinking_delta       → delta.reasoning_content (vLLM's field)
  //   tool_use block start → delta.tool_calls[{index, id, type, function {name, arguments ""}}]
  //                          (index 0, 1, … in the order of the tool_use blocks)
  //   input_json_delta     → delta.tool_calls[{index, function {arguments}}]
  //   tool_use block stop  → arguments "{}" when the tool got none (OpenAI's text for no arguments)
  //   message_delta        → the finish chunk (finish_reason from stop_reason), once
  //   message_stop         → the usage chunk (choices [], when asked for), then [DONE]
  //   error                → {"error":{"message","type","param":null,"code":null}}, then [DONE]
  // ping, signature_delta, citations_delta and blocks without a chat
  // equivalent (redacted_thinking, server tools) give nothing. After the
  // stream ended for the client ([DONE] went out) everything is swallowed.
  void on_data(std::string_view data, ChunkSink& sink);

  // The upstream's body ended: after a message_delta without message_stop
  // the usage chunk (if asked) and [DONE]; before any message_delta an
  // error (the answer was cut short) and [DONE]. Nothing once ended().
  void finish(ChunkSink& sink);

  // [DONE] went to the sink: the stream is over for the client.
  bool ended() const { return ended_; }
  // The finish chunk went out (a message_delta came): the answer is whole.
  bool finished() const { return finish_sent_; }
  // Usage as OpenAI counts it (upstream_response.hpp), once it is the
  // message's: message_start's is only the prompt and a first output count
  // (1), the real output count comes with message_delta. A stream cut
  // before that (the client left, a reset, an error event, an idle timeout),
  // or whose message_delta said no output_tokens (absent or null) or
  // message_start no input_tokens, has no usage: it is charged the parts
  // said (said_usage()) and the estimate of the rest (docs/admission.md).
  bool has_usage() const { return started_ && prompt_said_ && usage_final_ && !usage_invalid(); }
  Usage usage() const { return usage_.openai(); }
  // A usage count came out of range (AnthropicUsage::invalid): no usage, ever, for this stream; or a usage
  // left out the count its event must say (message_start's input_tokens, message_delta's output_tokens).
  bool usage_invalid() const { return usage_.invalid || usage_missing_; }
  // The parts of the usage the stream said, whatever else it left out: the prompt (input, cache reads and
  // writes) once message_start said its input_tokens, the real one, final or not; the output once a
  // message_delta said its output_tokens. Nothing when a count did not read (AnthropicUsage::invalid).
  PartialUsage said_usage() const;

 private:
  enum class Block : std::uint8_t { none, text, thinking, tool, other };

  void begin_chunk();  // chunk_ = the chunk's fixed prefix, up to "choices":[
  void delta(std::string_view field, std::string_view text, ChunkSink& sink);
  void tool_arguments(std::string_view args, ChunkSink& sink);
  void end(ChunkSink& sink);  // usage chunk (if asked), [DONE]
  void fail(std::string_view type, std::string_view message, ChunkSink& sink);

  bool include_usage_ = false;
  bool started_ = false;
  bool usage_final_ = false;    // a message_delta's usage said output_tokens
  bool prompt_said_ = false;    // message_start's usage said input_tokens
  bool usage_missing_ = false;  // a usage left its event's count out (usage_invalid())
  bool finish_sent_ = false;
  bool ended_ = false;
  bool tool_args_sent_ = false;  // the open tool_use block got a non-empty argument piece
  std::string start_input_;      // the open tool_use block's `input` from its start, when not empty (JSON)
  Block block_ = Block::none;
  std::int64_t block_index_ = -1;  // Anthropic's index of the open block
  std::uint32_t next_tool_ = 0;    // OpenAI tool_calls[].index of the next tool_use block
  std::int64_t created_ = 0;
  AnthropicUsage usage_;
  std::string prefix_;  // {"id":…,"object":"chat.completion.chunk","created":…,"model":…,"choices":[
  std::string chunk_;
};

// An Anthropic stream passing through to an Anthropic client unchanged
// (POST /v1/messages to a type: anthropic pool): reads its usage
// (message_start, message_delta) and notices its end (message_stop or an
// error event). Only those events are parsed.
class PassthroughObserver {
 public:
  void reset() { *this = PassthroughObserver{}; }
  void on_data(std::string_view data);
  // message_stop or an error event passed: the stream is over for the client.
  bool ended() const { return ended_; }
  // As UpstreamStreamTranslator::has_usage: the message's usage, once
  // message_start said its input_tokens and a message_delta its output_tokens.
  bool has_usage() const { return started_ && prompt_said_ && usage_final_ && !usage_invalid(); }
  Usage usage() const { return usage_.openai(); }
  // As UpstreamStreamTranslator::usage_invalid.
  bool usage_invalid() const { return usage_.invalid || usage_missing_; }
  // As UpstreamStreamTranslator::said_usage.
  PartialUsage said_usage() const;

 private:
  bool ended_ = false;
  bool started_ = false;        // message_start's usage came
  bool prompt_said_ = false;    // and said input_tokens
  bool usage_final_ = false;    // a message_delta's usage said output_tokens
  bool usage_missing_ = false;  // as UpstreamStreamTranslator's
  AnthropicUsage usage_;
};

// What one Anthropic event carries, for holding a stream's head until its
// first content while a fallback is left (api/openai/stream.hpp's
// classify_chunk for OpenAI): content_block_start of a tool_use,
// content_block_delta and message_delta are content, error is an error,
// anything else (message_start, ping, a text block's start) empty.
openai::ChunkKind classify_event(std::string_view data);

}  // namespace weir::api::anthropic
