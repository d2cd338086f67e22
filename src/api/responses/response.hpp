// OpenAI Responses API response objects built from an OpenAI/vLLM
// chat-completions upstream's answers (OpenAI API reference: "Responses",
// the Response object; vLLM's OpenAI-compatible server, v0.10.1 wire
// format). Mappings: docs/protocols.md ("OpenAI Responses").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <boost/json/fwd.hpp>

#include "api/usage.hpp"

namespace weir::api::responses {

// One output item of a response, as the stream builds it up.
struct OutputItem {
  // refusal: a message item whose one content part is {"type":"refusal"} (the chat message's `refusal`).
  enum class Kind : std::uint8_t { reasoning, message, function_call, refusal };
  Kind kind = Kind::message;
  std::string id;       // "rs_…", "msg_…", "fc_…"
  std::string call_id;  // function_call: the upstream's tool call id
  std::string name;     // function_call: the function's name
  std::string text;     // reasoning or message text, function_call arguments, the refusal
  // message: its output_text's logprobs, the JSON text of the array's members without the brackets (chat's
  // choices[0].logprobs.content entries as they came: token, logprob, bytes, top_logprobs, the members of
  // Responses' logprobs too); empty: [].
  std::string logprobs;
  bool done = true;  // a stream sent its output_item.done (a whole answer's items are)
};

// A response's own members (the request's are the echo: request.hpp).
struct ResponseHead {
  std::string_view id;                           // "resp_…"
  std::int64_t created_at = 0;                   // Unix seconds: the upstream's `created`
  std::string_view model;                        // the upstream's model name
  std::string_view status;                       // "in_progress", "completed", "incomplete", "failed"
  std::string_view incomplete_reason;            // with "incomplete": "max_output_tokens" or "content_filter"
  std::string_view error_message;                // with "failed": error {code: error_code, message}
  std::string_view error_code = "server_error";  // or "invalid_prompt": the upstream refused the request
};

// Usage as Responses reports it; `reasoning_tokens` from the upstream's
// completion_tokens_details.reasoning_tokens (0 when it sends none, as vLLM
// 0.10.1 does).
struct ResponseUsage {
  Usage usage;
  std::uint64_t reasoning_tokens = 0;
};

// The ids of a response and its items, from the upstream completion id
// ("chatcmpl-X" → X, so the x-request-id Weir sends shows in them):
// appends `prefix` + X (prefix "resp_", "msg_", "rs_"; function calls add
// "_<n>" themselves).
void append_id(std::string& out, std::string_view prefix, std::string_view upstream_id);

// Appends the chat choice's (`choice`: a choices[] entry, or a chunk's)
// logprobs.content entries to `out`, comma-separated (OutputItem::logprobs:
// a comma before them when `out` is not empty); nothing when it has none.
// Chat's entries {token, logprob, bytes, top_logprobs[{token, logprob,
// bytes}]} are Responses' output_text logprobs as they are.
void append_logprobs(std::string& out, const boost::json::object& choice);

// Responses' status for a chat finish_reason: length → "incomplete" with
// reason "max_output_tokens", content_filter → "incomplete" with
// "content_filter"; stop, tool_calls, function_call and none → "completed"
// (reason empty). A failed finish (api::Finish::failed) has no status here:
// the callers fail the response before asking (translate_response,
// StreamTranslator); here it is "completed".
std::string_view status_of(std::string_view finish_reason, std::string_view& incomplete_reason);

// Appends one output item object. `status` is the item's ("in_progress",
// "completed", "incomplete"); `with_content` false writes an item as
// response.output_item.added shows it (empty text, arguments, parts).
void append_item_json(std::string& out, const OutputItem& item, std::string_view status, bool with_content = true);

// Appends the usage object {input_tokens, input_tokens_details{cached_tokens,
// cache_write_tokens (the upstream's prompt_tokens_details.cache_write_tokens:
// a type: anthropic pool's cache_creation_input_tokens; 0 when none reported)},
// output_tokens, output_tokens_details{reasoning_tokens}, total_tokens}.
void append_usage_json(std::string& out, const ResponseUsage& u);

// Appends the Response object: `head` (with `completed_at`, Unix seconds: now,
// when the status is "completed"; else null), `items` (each "completed", except:
// all "in_progress" while the response is, the last one "incomplete" when
// the response is, and those not `done` "incomplete" when it failed),
// `usage` (null when absent) and the request's `echo` members.
void append_response_json(std::string& out, const ResponseHead& head, std::span<const OutputItem> items,
                          const ResponseUsage* usage, std::string_view echo);

// Translates a whole chat.completion body (the first choice) into a Response
// written to `out` (overwritten): output items in order reasoning (vLLM's
// reasoning_content, or `reasoning`, then the thinking parts of a content
// list), message (the content, when not empty: a string, or the text parts of
// a list joined, as Mistral's API sends them; other parts skipped),
// a message with a refusal part (the message's `refusal`, when not empty),
// one function_call per tool call. Ids derive from the completion's id, or
// `fallback_id` (the request id) when it has none; `created_at` is its
// `created`, or now. Returns not_a_completion when `body` is not a chat
// completion with a choice (`out` empty), invalid_arguments when a function
// call's arguments are no JSON text (the client must not run it, as the
// stream fails then; `out` names the first such call: "function call
// <call_id> (<name>)"), unless it is the last item and the finish was
// "length": the call the limit cut, "incomplete" as the response is;
// unfinished when the choice's finish_reason is a failed one
// (api::Finish::failed: vLLM's "abort", "error", "repetition", or a value no
// mapping knows; `out` holds that value, cut to 64 bytes): the generation
// did not end, so there is no response to give, complete or incomplete.
enum class Translated : std::uint8_t { ok, not_a_completion, invalid_arguments, unfinished };
Translated translate_response(std::string_view body, std::string_view echo, std::string_view fallback_id,
                              std::string& out);

// Appends OpenAI's error object {"error":{"message","type","param","code"}}
// for an upstream's error answer (`status` >= 400 and its body) to a
// Responses client, whose errors keep OpenAI's shape (docs/protocols.md):
// api::append_openai_error_for() (the upstream's message, string type,
// param and code; vLLM's integer code null; a body that is no JSON object
// as its text, cut), with a `param` that names a chat-completions member
// Weir made from a Responses field naming that field (max_tokens →
// max_output_tokens, messages → input, response_format → text); the
// message stays the upstream's. Always rewritten, also when the body is
// OpenAI's shape already: its param may need the Responses name.
void append_upstream_error(std::string& out, int status, std::string_view body);

}  // namespace weir::api::responses
