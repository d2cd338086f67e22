// OpenAI "usage" extraction: "usage" found from the end of the object (where
// vLLM writes it), then its few members; the counts are read as JSON integers in place. No DOM: this
// runs once per response and on every usage chunk of a stream.
#include "api/usage.hpp"

#include <array>
#include <charconv>

#include "api/json_scan.hpp"

namespace weir::api {
namespace {

// A token count (absent and null are the caller's: not reported); nullopt for anything but a
// non-negative JSON integer (RFC 8259 §6: -?(0|[1-9][0-9]*), no fraction or
// exponent; 1.5, 12.0, 1e3, 01, "12", true and -1 are all rejected; -0 is 0)
// of at most kMaxUsageTokens: no request has more tokens, and a larger one
// billed as sent would sink a tenant's bucket and budget at once.
constexpr std::uint64_t kMaxCount = kMaxUsageTokens;
std::optional<std::uint64_t> count(std::string_view v) {
  std::string_view digits = v;
  const bool negative = !digits.empty() && digits.front() == '-';
  if (negative) digits.remove_prefix(1);
  if (digits.empty() || (digits.size() > 1 && digits.front() == '0')) return std::nullopt;
  std::uint64_t n = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
  if (negative && n != 0) return std::nullopt;
  if (n > kMaxCount) return std::nullopt;
  return n;
}

std::string_view value_of(std::string_view obj, const std::optional<MemberSpan>& m) {
  return obj.substr(m->value_begin, m->value_end - m->value_begin);
}

// What a usage object's text (one that begins with '{') says.
enum class Read : std::uint8_t { counts, none, invalid };
// The counts of a usage object's text into `out`: Read::none when it has no count at all, Read::invalid when
// they do not read or (on a generation route) one of prompt and completion is missing (`partial`: the other).
Read read_object(std::string_view usage, UsageRoute route, Usage& out, PartialUsage& partial);

}  // namespace

std::optional<Usage> extract_usage(std::string_view json, bool* invalid, UsageRoute route, PartialUsage* partial) {
  const auto span = find_last_member(json, "usage");
  if (!span) return std::nullopt;
  return read_usage(json.substr(span->value_begin, span->value_end - span->value_begin), invalid, route, partial);
}

std::optional<Usage> read_usage(std::string_view usage, bool* invalid, UsageRoute route, PartialUsage* partial) {
  if (usage.empty() || usage.front() != '{') {  // null (none), or not an object (invalid)
    if (invalid != nullptr && usage != "null") *invalid = true;
    return std::nullopt;
  }
  // Past here the upstream sent a usage object: one that does not read is invalid usage; one with no count
  // in it ({}) reported none.
  Usage out;
  PartialUsage said;
  switch (read_object(usage, route, out, said)) {
    case Read::counts:
      return out;
    case Read::none:
      return std::nullopt;
    case Read::invalid:
      if (invalid != nullptr) *invalid = true;
      if (partial != nullptr && (said.prompt || said.completion)) *partial = said;
      return std::nullopt;
  }
  return std::nullopt;  // not reached
}

namespace {

Read read_object(std::string_view usage, UsageRoute route, Usage& out, PartialUsage& partial) {
  static constexpr std::array<std::string_view, 4> kKeys = {"prompt_tokens", "completion_tokens", "total_tokens",
                                                            "prompt_tokens_details"};
  std::array<std::optional<MemberSpan>, 4> m;
  if (!find_members(usage, kKeys, m)) return Read::invalid;
  // A member whose value is null says no more than an absent one.
  for (auto& member : m)
    if (member && value_of(usage, member) == "null") member.reset();
  if (!m[0] && !m[1]) {
    // OpenAI's token usage of its audio answers ({"type": "tokens", "input_tokens", "output_tokens"}) names
    // the counts input and output: read as prompt and completion. (A second look only then: the common
    // shape pays nothing for it.)
    static constexpr std::array<std::string_view, 2> kTokens = {"input_tokens", "output_tokens"};
    std::array<std::optional<MemberSpan>, 2> t;
    if (!find_members(usage, kTokens, t)) return Read::invalid;
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i] && value_of(usage, t[i]) != "null") m[i] = t[i];
  }
  std::array<std::uint64_t, 3> n{};
  for (std::size_t i = 0; i < n.size(); ++i) {
    if (!m[i]) continue;
    const auto c = count(value_of(usage, m[i]));
    if (!c) return Read::invalid;
    n[i] = *c;
  }
  // No count at all ({}, every one null, an audio answer's {"type": "duration", "seconds": 3}): the upstream
  // reported no tokens, as one that sent no usage. (Prompt details without a prompt are no count: below.)
  if (!m[0] && !m[1] && !m[2] && !m[3]) return Read::none;
  out = Usage{n[0], n[1], n[2], 0};
  if (!m[0]) {
    // vLLM's rerank answers give only total_tokens: all of it is prompt. Only a pooling route's: a
    // generation's prompt is not its total (that counts the completion too).
    if (route == UsageRoute::generation || n[2] < n[1])
      out.prompt_tokens = 0;
    else
      out.prompt_tokens = n[2] - n[1];
  }

  if (m[3]) {
    const std::string_view details = value_of(usage, m[3]);
    if (details.empty() || details.front() != '{') return Read::invalid;
    static constexpr std::array<std::string_view, 2> kCached = {"cached_tokens", "cache_write_tokens"};
    std::array<std::optional<MemberSpan>, 2> c;
    if (!find_members(details, kCached, c)) return Read::invalid;
    if (c[0] && value_of(details, c[0]) != "null") {
      const auto cached = count(value_of(details, c[0]));
      if (!cached) return Read::invalid;
      out.cached_tokens = *cached;
    }
    if (c[1] && value_of(details, c[1]) != "null") {
      const auto written = count(value_of(details, c[1]));
      if (!written) return Read::invalid;
      out.cache_write_tokens = *written;
    }
  }
  // Cached and written prompt tokens are parts of the prompt (OpenAI's and OpenRouter's prompt_tokens
  // count them): a part larger than the whole (cached 5000 of a 5-token prompt) is a count that cannot be
  // billed as sent, as a negative one is, on every path that reads usage (the log, the metrics, the
  // charge, the Anthropic and Responses translations).
  if (out.cached_tokens > out.prompt_tokens || out.cache_write_tokens > out.prompt_tokens) return Read::invalid;
  if (route == UsageRoute::generation && (!m[0] || !m[1])) {
    // A generation's usage that left its prompt or its completion out (absent or null: some servers send
    // "completion_tokens": null when they did not count): that part was not reported, and 0 is no count
    // of it. The part it did say stands; the request is charged the no-usage estimate of the other.
    partial.prompt = m[0].has_value();
    partial.completion = m[1].has_value();
    partial.counts = PartialUsage::Counts(out);
    if (!partial.prompt) partial.counts = PartialUsage::Counts(Usage{0, out.completion_tokens, 0, 0});
    return Read::invalid;
  }
  return Read::counts;
}

}  // namespace

}  // namespace weir::api
