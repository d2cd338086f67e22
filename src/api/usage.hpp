// Token usage reported by a model server (OpenAI "usage" object, as vLLM sends it).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace weir::api {

// Token counts from an OpenAI-shaped `usage` object, in tokens.
struct Usage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  std::uint64_t total_tokens = 0;
  // usage.prompt_tokens_details.cached_tokens; 0 when absent.
  std::uint64_t cached_tokens = 0;
  // usage.prompt_tokens_details.cache_write_tokens (OpenRouter's name; Weir
  // writes it for a type: anthropic pool's cache_creation_input_tokens): the
  // prompt tokens written to a prompt cache; 0 when absent (vLLM reports none).
  std::uint64_t cache_write_tokens = 0;
  // Of cache_write_tokens, those written for an hour (a type: anthropic pool's
  // cache_creation.ephemeral_1h_input_tokens; Anthropic bills them above the
  // 5-minute writes); 0 when absent. Never read from an OpenAI-shaped usage.
  std::uint64_t cache_write_1h_tokens = 0;
};

// The most tokens one usage count may say: 2^24 (16,777,216), over every
// model's context window today (a million tokens or so) and far below what
// would wrap a tenant's bucket or budget. An upstream that reports more (2^31,
// say: a bug, or a server not to be trusted) reports no usage that can be billed.
inline constexpr std::uint64_t kMaxUsageTokens = std::uint64_t{1} << 24;

// What a route's answers count. A generation (chat, completion, message,
// response, transcript) reports its prompt and its completion; a pooling
// answer (embeddings, rerank, score, classify) its prompt only, and vLLM's
// rerank only total_tokens: all of it prompt.
enum class UsageRoute : std::uint8_t { generation, pooling };

// The parts of a generation's usage the upstream did say when it left the
// other out (absent or null: {"prompt_tokens": 11, "completion_tokens":
// null}): such a usage is invalid (it cannot be billed as sent), and the
// request is charged the parts said and the no-usage estimate of the rest
// (docs/admission.md, "Usage out of range").
// (Held by every stream's usage hook and request context: 24 bytes, counts as 32 bits, which every count
// that reads is: kMaxUsageTokens.)
struct PartialUsage {
  struct Counts {
    std::uint32_t prompt_tokens = 0;
    std::uint32_t completion_tokens = 0;
    std::uint32_t cached_tokens = 0;
    std::uint32_t cache_write_tokens = 0;
    std::uint32_t cache_write_1h_tokens = 0;
    Counts() = default;
    // A Usage's counts but total_tokens, each at most UINT32_MAX.
    explicit Counts(const Usage& u)
        : prompt_tokens(narrow(u.prompt_tokens)),
          completion_tokens(narrow(u.completion_tokens)),
          cached_tokens(narrow(u.cached_tokens)),
          cache_write_tokens(narrow(u.cache_write_tokens)),
          cache_write_1h_tokens(narrow(u.cache_write_1h_tokens)) {}
    static std::uint32_t narrow(std::uint64_t n) { return n > UINT32_MAX ? UINT32_MAX : static_cast<std::uint32_t>(n); }
  };
  Counts counts;            // the parts said; 0 in the others
  bool prompt = false;      // counts' prompt_tokens and its cached and cache-write tokens are the upstream's
  bool completion = false;  // counts' completion_tokens is the upstream's
};

// Reads the top-level "usage" member of a response body or a stream chunk's
// data (a JSON object text). Returns nullopt when the member is absent, null,
// not an object, or the text is not valid JSON (checked: the top-level
// structure and the usage value; the rest is only skipped over), and when the
// object has no count at all (`{}`, every count null: nothing reported). A
// count that is absent or null is not reported: on a `generation` route a
// usage must say both prompt_tokens and completion_tokens (or OpenAI audio's
// input_tokens and output_tokens); one that says only one of them, or only
// total_tokens, makes the result nullopt, sets `*invalid` and writes the part
// it said to `*partial` (when given; left as it was otherwise). On a
// `pooling` route an absent completion is 0 and an absent prompt is
// total_tokens less the completion (vLLM's rerank). An absent or null
// total_tokens, cached_tokens or cache_write_tokens reads as 0. A count that
// is not a non-negative JSON integer (1.5, 1e3, "12", true, -1) or is over
// kMaxUsageTokens, or a cached_tokens or cache_write_tokens over prompt_tokens
// (a part of the prompt larger than it), makes the whole result nullopt
// rather than a guess, and sets `*invalid` (when given) to true: a usage the
// upstream did send, which cannot be billed as sent (a `usage` that is no
// object, null aside, too). `*invalid` is left as it was otherwise. Cost:
// one scan of the top-level object's last members, and a parse of the usage
// value only, into a stack buffer.
std::optional<Usage> extract_usage(std::string_view json, bool* invalid = nullptr,
                                   UsageRoute route = UsageRoute::generation, PartialUsage* partial = nullptr);

// The same reading of a "usage" member's value text already found (by
// find_members, in a scan that looked for other members too): `value` is
// its JSON text, from its first byte to its last. Returns nullopt for null,
// anything but an object, or a usage that does not read, as extract_usage
// (and sets `*invalid` and `*partial` as it does).
std::optional<Usage> read_usage(std::string_view value, bool* invalid = nullptr,
                                UsageRoute route = UsageRoute::generation, PartialUsage* partial = nullptr);

}  // namespace weir::api
