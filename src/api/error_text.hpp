// The texts of two errors the translators and the request parser pass on:
// a client body's 400 (invalid_body_message) and the message inside an
// upstream's error answer (upstream_error_message, upstream_error_text);
// and an upstream's error answer in OpenAI's shape (append_openai_error_for,
// is_openai_error). All run on failure paths only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/system/error_code.hpp>

namespace weir::api {

// The 400 message for a client `body` the parser refused with `ec`: "The
// request body is not valid JSON: <why>.", or, when it is nested deeper than
// kMaxBodyDepth, that (it is valid JSON Weir does not read). <why> names
// the two faults Boost.JSON reports vaguely: ill-formed UTF-8 (RFC 8259
// §8.1), which it calls a syntax error, and a lone surrogate escape
// ("\ud800" without its low half, or "\udc00" alone: §8.2 and Unicode
// §3.9 leave it no character), which it calls a syntax error or an
// illegal leading or trailing surrogate by where its buffer ended. Told
// apart by scanning `body`, on this failure path only.
std::string invalid_body_message(const boost::system::error_code& ec, std::string_view body);

// The message of an upstream's error answer: vLLM's and OpenAI's
// {"error":{"message"}}, vLLM's older {"object":"error","message"},
// {"error": "<text>"} (Hugging Face TGI, Ollama), FastAPI's {"detail":
// "<text>"}, or FastAPI's validation answer {"detail": [{"loc", "msg"},
// ...]} as "loc.path: msg; ..." without the leading "body". "" when `body`
// has none, and when it is not valid JSON (ill-formed UTF-8 among that):
// what is returned is valid UTF-8 to relay.
std::string upstream_error_message(std::string_view body);

// The message a client gets for an upstream's error answer (`status` >= 400, or 0 for an error event inside a
// stream): upstream_error_message(); for a body that is no JSON object (a proxy's HTML page, a plain-text
// "Internal Server Error"), "Upstream answered <status>: <text>" (the stream's: "The upstream's stream failed:
// <text>"), its text with each run of ASCII whitespace one space, cut on a UTF-8 boundary to
// kMaxUpstreamTextBytes (then "..."), ill-formed UTF-8 as U+FFFD; else (a JSON object without a message, an
// empty body) "Upstream answered <status>." ("The upstream's stream failed.").
inline constexpr std::size_t kMaxUpstreamTextBytes = 256;
std::string upstream_error_text(int status, std::string_view body);

// A refusal for the model's context length, read from an upstream error's message: vLLM's wordings (all
// versions: "This model's maximum context length is L tokens. However, you requested T tokens (I in the
// messages, O in the completion)...", "... However, you requested O output tokens and your prompt contains [at
// least ]I input tokens, for a total of ...", "Requested token count exceeds the model's maximum context length
// of L tokens. You requested a total of T tokens: I tokens from the input messages and O tokens for the
// completion...", "You passed I input tokens and requested O output tokens. However, the model's context length
// is only L tokens...", "'max_tokens' or 'max_completion_tokens' is too large: O. This model's maximum context
// length is L tokens and your request has I input tokens ...", the engine's "The decoder prompt (length I) is
// longer than the maximum model length of L."), OpenAI's ("... However, your messages resulted in I tokens.")
// and Anthropic's ("prompt is too long: I tokens > L maximum", "input length and `max_tokens` exceed context
// limit: I + O > L, ..."). nullopt for any other message. The counts are tokens, -1 where the message does not
// give them (vLLM's "You passed N input characters" gives no input count); `input` is a lower bound where vLLM
// says "at least" (it stops counting a prompt one token past what fits).
struct ContextLengthError {
  std::int64_t limit = -1;   // the model's context length
  std::int64_t input = -1;   // the prompt's tokens
  std::int64_t output = -1;  // the completion's tokens asked for (max_tokens)
};
std::optional<ContextLengthError> context_length_error(std::string_view message);

// Anthropic's message for a context-length refusal, as Claude Code reads it to compact the conversation or
// lower max_tokens: "prompt is too long: I tokens > L maximum" when the input alone exceeds the context
// length, else "input length and `max_tokens` exceed context limit: I + O > L, decrease input length or
// `max_tokens` and try again" when they exceed it together; "" when the counts do not show either.
std::string anthropic_context_length_message(const ContextLengthError& e);

// Whether an upstream's error answer (a body, or an error event's data) is already OpenAI's error object as
// the openai SDKs read it (OpenAI API reference, "Error codes"; openai-python's types/shared/error_object.py):
// a JSON object whose `error` is an object with a string `message`, and a `type`, `param` and `code` each
// absent, null or a string, the code set when the message is a context-length refusal (context_length_error).
// Such a body passes to the client byte for byte.
bool is_openai_error(std::string_view body);

// Appends OpenAI's error object {"error":{"message","type","param","code"}} for an upstream's error answer
// (`status` >= 400 and its body; 0 and the data for an error event inside a stream) whose body is not one
// (is_openai_error): the message by upstream_error_text(); the upstream's `type`, `param` and `code` where
// they are strings (in `error`, or at the top as vLLM's older {"object":"error",...} has them), `param` passed
// through `rename_param` when given. vLLM's integer `code` (every vLLM version writes the status there, also
// in a stream's error event) is null: OpenAI's `code` is a string or null (openai-java's typed code() throws
// on a number), a word such as "context_length_exceeded" clients compare, never a status, and the status is
// the answer's own. A missing type is invalid_request_error for a 4xx, else server_error (for an error event:
// by its integer code, 4xx or not). A client fault whose code is not a string and whose message is a
// context-length refusal (context_length_error) is OpenAI's: type invalid_request_error, code
// "context_length_exceeded", param the upstream's, else `context_param` (the request member that holds the
// prompt: "messages" for chat, "prompt" for completions, "input" for embeddings; "" for null), through
// `rename_param`; the message stays the upstream's.
void append_openai_error_for(std::string& out, int status, std::string_view body,
                             std::string_view (*rename_param)(std::string_view) = nullptr,
                             std::string_view context_param = "messages");

}  // namespace weir::api
