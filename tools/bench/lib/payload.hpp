// Request bodies and the bytes of a whole HTTP/1.1 request for weir-bench.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weir::bench {

// The seed-000 prompt: deterministic English-like text of `words` words
// (300 words is about 400 tokens for GPT-style BPE tokenizers), the same on
// every run and machine (a fixed word list and a fixed xorshift sequence).
std::string seed_prompt(std::size_t words = 300);

// Overrides applied to the built-in payloads (not to --payload-file bodies).
struct BodyOptions {
  std::string model = "mock-model";
  int max_tokens = -1;  // -1: the payload's default
  int stream = -1;      // -1: the payload's default; 0/1: force
};

// Built-in payloads, serialized JSON:
//   "seed000": chat completion, one user message of seed_prompt(), max_tokens
//              128, stream true, stream_options.include_usage true.
//   "small":   chat completion "Say hello.", max_tokens 16, stream false.
// Returns nullopt for an unknown name.
std::optional<std::string> builtin_body(std::string_view name, const BodyOptions& opt);

// One JSON body per non-empty line of `text` (a --payload-file's contents).
std::vector<std::string> split_lines(std::string_view text);

// True if the body asks for a stream ("stream": true at any depth; a cheap
// scan used only to choose the Accept header).
bool body_wants_stream(std::string_view body);

// A complete HTTP/1.1 POST request: request line, Host, Content-Type,
// Content-Length, Accept (text/event-stream when `sse`), User-Agent, the
// extra `headers` ("Name: value" each, sent as given), blank line, body.
std::string build_request(std::string_view path, std::string_view host, const std::vector<std::string>& headers,
                          std::string_view body, bool sse);

// "30s", "500ms", "2m", "1h", "250us", "1.5s"; a bare number is seconds.
// Returns ns, or nullopt if malformed or negative.
std::optional<std::int64_t> parse_duration_ns(std::string_view text);

}  // namespace weir::bench
