#include "api/openai/stream.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <optional>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "api/json_scan.hpp"
#include "api/json_write.hpp"
#include "api/wide_integers.hpp"
#include "core/text.hpp"

namespace weir::api::openai {

UsageAsk ask_for_usage(std::string_view body, bool has_stream_options, std::string& scratch, std::string& out) {
  if (!has_stream_options)
    return set_member(body, "stream_options", R"({"include_usage":true})", out) ? UsageAsk::for_weir : UsageAsk::none;
  auto span = find_member(body, "stream_options");
  if (!span) return UsageAsk::none;
  std::string_view obj = body.substr(span->value_begin, span->value_end - span->value_begin);
  const auto iu = find_member(obj, "include_usage");
  if (!iu) {
    // vLLM's StreamOptions.include_usage defaults to true: the client asked
    // for the usage chunk (vLLM is the reference). Said explicitly, so an
    // upstream that reads the member as OpenAI does (absent: no usage) sends
    // it too, and the stream is counted, not charged Weir's estimate.
    return set_member(obj, "include_usage", "true", scratch) && set_member(body, "stream_options", scratch, out)
               ? UsageAsk::for_client
               : UsageAsk::none;
  }
  // Only a client's false (or null) is turned on: any other value ("true",
  // 1) is the upstream's to read or refuse, and the body goes as it came.
  const std::string_view v = obj.substr(iu->value_begin, iu->value_end - iu->value_begin);
  if (v != "false" && v != "null") return UsageAsk::none;
  // vLLM ignores continuous_usage_stats unless include_usage is true: once
  // Weir turns usage on, keep per-chunk usage off, as the client had it.
  std::string no_continuous;
  if (find_member(obj, "continuous_usage_stats") && set_member(obj, "continuous_usage_stats", "false", no_continuous))
    obj = no_continuous;
  return set_member(obj, "include_usage", "true", scratch) && set_member(body, "stream_options", scratch, out)
             ? UsageAsk::for_weir
             : UsageAsk::none;
}

namespace {

// classify_chunk's reader: one pass of Boost.JSON's SAX parser over the
// chunk, keeping a few flags by where each value sits (no DOM: the DOM of a
// 230-byte chunk cost ~6,600 instructions, and the first token of every
// stream waits for one or two of them). It answers what the DOM walk did,
// duplicate members included: a repeated member's last value is the one
// read, as boost::json::object keeps it (and vLLM's Python parser).
class ChunkReader {
 public:
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);

  ChunkKind verdict() const {
    if (!root_object_ || error_member_ || object_error_) return ChunkKind::error;
    return choices_content_ ? ChunkKind::content : ChunkKind::empty;
  }
  // A choice has text, a content/refusal/reasoning delta or tool calls: more than a finish_reason.
  bool tokens() const { return choices_tokens_; }

  bool on_document_begin(boost::system::error_code&) { return true; }
  bool on_document_end(boost::system::error_code&) { return true; }
  bool on_object_begin(boost::system::error_code&) { return begin(true); }
  bool on_object_end(std::size_t n, boost::system::error_code&) { return end(n); }
  bool on_array_begin(boost::system::error_code&) { return begin(false); }
  bool on_array_end(std::size_t n, boost::system::error_code&) { return end(n); }
  bool on_key_part(boost::json::string_view s, std::size_t, boost::system::error_code&) {
    append(key_buf_, sizeof key_buf_, key_len_, s);
    return true;
  }
  bool on_key(boost::json::string_view s, std::size_t, boost::system::error_code&) {
    std::string_view k(s.data(), s.size());  // (a key in one piece: the usual case)
    if (key_len_ > 0) {
      append(key_buf_, sizeof key_buf_, key_len_, s);
      k = key_len_ <= sizeof key_buf_ ? std::string_view(key_buf_, key_len_) : std::string_view();
    }
    key_ = identify(parent(), k);
    key_len_ = 0;
    return true;
  }
  bool on_string_part(boost::json::string_view s, std::size_t, boost::system::error_code&) {
    if (want_text()) append(text_buf_, sizeof text_buf_, text_len_, s);
    return true;
  }
  bool on_string(boost::json::string_view s, std::size_t size, boost::system::error_code&) {
    if (want_text()) append(text_buf_, sizeof text_buf_, text_len_, s);
    const bool is_error = text_len_ == 5 && std::memcmp(text_buf_, "error", 5) == 0;
    text_len_ = 0;
    return scalar(Value::string, size > 0, is_error);
  }
  bool on_number_part(boost::json::string_view, boost::system::error_code&) { return true; }
  // (A scalar's truth, as Python reads it, for the `error` member: 0, 0.0 and false are none.)
  bool on_int64(std::int64_t v, boost::json::string_view, boost::system::error_code&) { return other(v != 0); }
  bool on_uint64(std::uint64_t v, boost::json::string_view, boost::system::error_code&) { return other(v != 0); }
  bool on_double(double v, boost::json::string_view, boost::system::error_code&) { return other(v != 0); }
  bool on_bool(bool v, boost::system::error_code&) { return other(v); }
  bool on_null(boost::system::error_code&) { return scalar(Value::null, false, false); }
  bool on_comment_part(boost::json::string_view, boost::system::error_code&) { return true; }
  bool on_comment(boost::json::string_view, boost::system::error_code&) { return true; }

 private:
  // Where a container sits: the ones the verdict reads, and the rest.
  enum class Role : std::uint8_t { root, choices, choice, delta, other };
  // The members the verdict reads (kNone: any other, or a longer key).
  enum Key : std::uint8_t {
    kNone,
    kError,
    kObject,
    kChoices,
    kFinish,
    kText,
    kDelta,
    kContent,
    kRefusal,
    kReasoningContent,
    kReasoning,
    kToolCalls
  };
  enum class Value : std::uint8_t { string, null, object, array, other };
  struct Frame {
    Role role;
    Key key;      // the member this container is the value of (kNone in an array)
    bool object;  // else an array
  };
  static constexpr std::size_t kDepth = 40;  // > parse_options' max_depth (32): never reached

  // The member named `k` of an object of role `in`, if the verdict reads it.
  static Key identify(Role in, std::string_view k) {
    switch (in) {
      case Role::root:
        return k == "error" ? kError : k == "object" ? kObject : k == "choices" ? kChoices : kNone;
      case Role::choice:
        return k == "finish_reason" ? kFinish : k == "text" ? kText : k == "delta" ? kDelta : kNone;
      case Role::delta:
        if (k.size() < 7) return kNone;
        return k == "content"             ? kContent
               : k == "refusal"           ? kRefusal
               : k == "reasoning_content" ? kReasoningContent
               : k == "reasoning"         ? kReasoning
               : k == "tool_calls"        ? kToolCalls
                                          : kNone;
      case Role::choices:
      case Role::other:
        return kNone;
    }
    return kNone;
  }
  // Bytes of a key or string kept for the comparisons above (at most the
  // longest name, + 1 so a longer one never matches); the length counts all.
  static void append(char* buf, std::size_t cap, std::size_t& len, boost::json::string_view s) {
    if (len < cap) std::memcpy(buf + len, s.data(), std::min(cap - len, s.size()));
    len += s.size();
  }
  Role parent() const { return depth_ == 0 ? Role::other : frames_[depth_ - 1].role; }
  // Only the root's "object" string is compared.
  bool want_text() const { return depth_ == 1 && key_ == kObject; }

  // A value of member `key` of a container of role `in` (kNone in an array): its verdicts, the last
  // value of a repeated member replacing what an earlier one set.
  void value(Role in, Key key, Value v, bool non_empty, bool is_error) {
    switch (in) {
      case Role::root:
        // An error member that is falsy (null, false, 0, "", {}, []) is none: the openai SDK raises only
        // on a truthy one (`if data.get("error")`).
        if (key == kError) error_member_ = v != Value::null && non_empty;
        if (key == kObject) object_error_ = v == Value::string && is_error;
        if (key == kChoices && v != Value::array) choices_content_ = choices_tokens_ = false;  // (an array: at its end)
        return;
      case Role::choice:
        if (key == kFinish) finish_ = v != Value::null;
        if (key == kText) text_ = v == Value::string && non_empty;
        if (key == kDelta && v != Value::object) delta_ = false;  // (an object: at its end)
        return;
      case Role::delta:
        // (content may be a list of parts, as Mistral sends it: a non-empty one is content.)
        if (key >= kContent && key <= kReasoning)
          delta_text_[key - kContent] = (v == Value::string || (key == kContent && v == Value::array)) && non_empty;
        if (key == kToolCalls) tool_calls_ = v == Value::array && non_empty;
        return;
      case Role::choices:
      case Role::other:
        return;
    }
  }
  bool scalar(Value v, bool non_empty, bool is_error) {
    if (depth_ == 0) return true;  // a root that is no object: root_object_ stays false
    value(parent(), key_, v, non_empty, is_error);
    key_ = kNone;
    return true;
  }
  bool other(bool truthy) { return scalar(Value::other, truthy, false); }
  bool begin(bool object) {
    if (depth_ >= kDepth) return false;  // (unreachable: max_depth stops the parser first)
    const Role in = parent();
    const Key key = key_;  // (kNone in an array)
    Role role = Role::other;
    if (depth_ == 0) {
      root_object_ = object;
      role = object ? Role::root : Role::other;
    } else if (in == Role::root && key == kChoices && !object) {
      role = Role::choices;
      choices_acc_ = tokens_acc_ = false;
    } else if (in == Role::choices && object) {
      role = Role::choice;
      finish_ = text_ = delta_ = false;
    } else if (in == Role::choice && key == kDelta && object) {
      role = Role::delta;
      delta_text_[0] = delta_text_[1] = delta_text_[2] = delta_text_[3] = tool_calls_ = false;
    }
    frames_[depth_++] = Frame{role, key, object};
    key_ = kNone;
    return true;
  }
  bool end(std::size_t size) {
    const Frame f = frames_[--depth_];
    const Role in = parent();
    switch (f.role) {
      case Role::choices:
        choices_content_ = choices_acc_;
        choices_tokens_ = tokens_acc_;
        return true;
      case Role::choice:
        choices_acc_ = choices_acc_ || finish_ || text_ || delta_;
        tokens_acc_ = tokens_acc_ || text_ || delta_;
        return true;
      case Role::delta:
        delta_ = delta_text_[0] || delta_text_[1] || delta_text_[2] || delta_text_[3] || tool_calls_;
        return true;
      case Role::root:
        return true;
      case Role::other:
        break;
    }
    if (depth_ > 0) value(in, f.key, f.object ? Value::object : Value::array, size > 0, false);
    return true;
  }

  Frame frames_[kDepth]{};
  std::size_t depth_ = 0;
  Key key_ = kNone;
  char key_buf_[18]{};  // "reasoning_content" + 1
  std::size_t key_len_ = 0;
  char text_buf_[6]{};  // "error" + 1
  std::size_t text_len_ = 0;
  bool root_object_ = false, error_member_ = false, object_error_ = false, choices_content_ = false;
  bool choices_acc_ = false, finish_ = false, text_ = false, delta_ = false, tool_calls_ = false;
  bool choices_tokens_ = false, tokens_acc_ = false;  // (as choices_content_, choices_acc_: without a finish_reason)
  bool delta_text_[4]{};
};

}  // namespace

ChunkKind classify_chunk(std::string_view data) {
  boost::json::basic_parser<ChunkReader> p(boost::json::parse_options{});
  boost::system::error_code ec;
  const std::size_t used = p.write_some(false, data.data(), data.size(), ec);
  if (ec || used < data.size()) return ChunkKind::error;  // an invalid stream
  return p.handler().verdict();
}

bool chunk_has_tokens(std::string_view data) {
  boost::json::basic_parser<ChunkReader> p(boost::json::parse_options{});
  boost::system::error_code ec;
  const std::size_t used = p.write_some(false, data.data(), data.size(), ec);
  return !ec && used == data.size() && p.handler().verdict() == ChunkKind::content && p.handler().tokens();
}

bool looks_like_content(std::string_view data) {
  if (std::memchr(data.data(), '\\', data.size()) != nullptr) return classify_chunk(data) == ChunkKind::content;
  // Without a backslash every '"' delimits a string, so a string followed by ':' is a member name, and a ':'
  // inside a string value is never one preceded by a name's closing quote.
  const char* const begin = data.data();
  const char* const end = begin + data.size();
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  for (const char* p = begin; p < end;) {
    const auto* colon = static_cast<const char*>(std::memchr(p, ':', static_cast<std::size_t>(end - p)));
    if (colon == nullptr) return false;
    p = colon + 1;
    const char* q = colon;
    while (q > begin && ws(q[-1])) --q;
    if (q == begin || q[-1] != '"') continue;
    const char* close = q - 1;
    const char* open = close;
    while (open > begin && open[-1] != '"') --open;
    if (open == begin) continue;
    const std::string_view name(open, static_cast<std::size_t>(close - open));
    enum { kText, kCalls, kFinish, kOther } kind = kOther;
    switch (name.size()) {
      case 4:
        if (name == "text") kind = kText;
        break;
      case 7:
        if (name == "content" || name == "refusal") kind = kText;
        break;
      case 9:
        if (name == "reasoning") kind = kText;
        break;
      case 10:
        if (name == "tool_calls") kind = kCalls;
        break;
      case 13:
        if (name == "finish_reason") kind = kFinish;
        break;
      case 17:
        if (name == "reasoning_content") kind = kText;
        break;
      default:
        break;
    }
    if (kind == kOther) continue;
    const char* v = p;
    while (v < end && ws(*v)) ++v;
    if (v == end) return false;
    if (*v == 'n') continue;  // null
    if (kind == kFinish) return true;
    if (kind == kText && *v == '"' && v + 1 < end && v[1] == '"') continue;  // ""
    if ((kind == kCalls || kind == kText) && *v == '[') {  // (content may be a list of parts: Mistral's)
      const char* w = v + 1;
      while (w < end && ws(*w)) ++w;
      if (w < end && *w == ']') continue;  // []
    }
    return true;
  }
  return false;
}

bool may_be_finish_only(std::string_view data) {
  // vLLM's and OpenAI's content chunks say "finish_reason":null; a finish says a string there.
  for (std::size_t at = data.find("\"finish_reason\""); at != std::string_view::npos;
       at = data.find("\"finish_reason\"", at + 1)) {
    std::size_t i = at + 15;
    while (i < data.size() && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r')) ++i;
    if (i >= data.size() || data[i] != ':') continue;
    ++i;
    while (i < data.size() && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r')) ++i;
    if (!data.substr(i).starts_with("null")) return true;
  }
  return false;
}

bool begins_like_error(std::string_view data) {
  auto ws = [&](std::size_t i) {
    while (i < data.size() && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r')) ++i;
    return i;
  };
  auto at = [&](std::size_t i, std::string_view s) { return data.substr(i, s.size()) == s; };
  std::size_t i = ws(0);
  if (i >= data.size() || data[i] != '{') return false;
  i = ws(i + 1);
  if (at(i, "\"error\"")) return true;
  std::size_t key = 0;
  if (at(i, "\"object\""))
    key = 8;
  else if (at(i, "\"type\""))
    key = 6;
  else
    return false;
  i = ws(i + key);
  if (i >= data.size() || data[i] != ':') return false;
  return at(ws(i + 1), "\"error\"");
}

namespace {

// A chunk's top-level "choices" and "usage", in one scan of it.
struct ChunkMembers {
  std::optional<MemberSpan> choices;
  std::optional<MemberSpan> usage;
};

std::optional<ChunkMembers> chunk_members(std::string_view data) {
  static constexpr std::array<std::string_view, 2> kKeys = {"choices", "usage"};
  std::array<std::optional<MemberSpan>, 2> m;
  if (!find_members(data, kKeys, m)) return std::nullopt;
  return ChunkMembers{m[0], m[1]};
}

std::string_view value_text(std::string_view data, const MemberSpan& m) {
  return data.substr(m.value_begin, m.value_end - m.value_begin);
}

// `"choices": []` (whitespace inside allowed) with a `usage` member beside it.
bool usage_only(std::string_view data, const ChunkMembers& m) {
  if (!m.choices || !m.usage) return false;
  const std::string_view v = value_text(data, *m.choices);
  if (v.size() < 2 || v.front() != '[' || v.back() != ']') return false;
  for (char c : v.substr(1, v.size() - 2))
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return false;
  return true;
}

}  // namespace

bool is_usage_only_chunk(std::string_view data) {
  const auto m = chunk_members(data);
  return m && usage_only(data, *m);
}

bool UsageHook::on_data(std::string_view data) {
  // Once per SSE event: one SIMD pass (core::find_substring), not
  // string_view::find, which calls memchr again at each '"' of the chunk
  // (~40 in a vLLM chunk), nor glibc's memmem (~2 instructions per byte).
  saw_usage_ = false;
  if (core::find_substring(data, "\"usage\"") == std::string_view::npos) return true;
  // Then one scan of the chunk's top level finds both members the rest
  // reads (with continuous_usage_stats every chunk gets here).
  const auto m = chunk_members(data);
  if (!m || !m->usage) return true;
  saw_usage_ = true;
  usage_span_ = *m->usage;
  usage_of_ = data;
  // Counts that do not read (negative, fractional, not numbers, over
  // kMaxUsageTokens) are no usage: the request is metered as one without
  // (gateway settle()), and said to be (invalid()).
  // The usage chunk Weir asked for on the client's behalf is not theirs,
  // whatever its numbers say: it is known by its shape, not by its counts.
  const bool only = usage_only(data, *m);
  if (auto u = read_usage(value_text(data, *m->usage), &invalid_, UsageRoute::generation, &partial_))
    on_usage(data, m->choices, *u, only);
  if (strip_ && only) return false;
  if (only) usage_chunk_ = true;
  return true;
}

void UsageHook::on_usage(std::string_view data, const std::optional<MemberSpan>& choices, const Usage& u,
                         bool usage_only) {
  // A chunk with no choice (vLLM's usage-only chunk; also one without a
  // "choices" array) carries the request's total.
  if (usage_only) {
    whole_ = true;
    usage_ = u;
    return;
  }
  const auto first = choices ? first_element(value_text(data, *choices)) : std::nullopt;
  if (!first) {
    whole_ = true;
    usage_ = u;
    return;
  }
  // One choice's usage (vLLM puts one choice in each chunk): its index,
  // 0 when it has none that reads. A chunk of several choices is counted
  // as its first's (no server sends one with per-choice usage).
  const std::string_view choice = data.substr(choices->value_begin + first->begin, first->end - first->begin);
  std::uint64_t index = 0;
  if (const auto i = find_member(choice, "index")) {
    const std::string_view v = choice.substr(i->value_begin, i->value_end - i->value_begin);
    if (std::from_chars(v.data(), v.data() + v.size(), index).ptr != v.data() + v.size()) index = 0;
  }
  if (index >= kMaxChoices) return;
  if (index >= choices_.size()) {
    if (choices_.capacity() == 0) choices_.reserve(8);
    choices_.resize(static_cast<std::size_t>(index) + 1);
  }
  // vLLM's counts are that choice's so far: they only grow (its prompt's count is the same on every chunk).
  // The largest of each, so a later chunk that says less (a broken or hostile upstream, then cut) lowers no
  // charge the upstream already reported.
  auto& c = choices_[index];
  c = {true, std::max(c.prompt_tokens, u.prompt_tokens), std::max(c.completion_tokens, u.completion_tokens),
       std::max(c.cached_tokens, u.cached_tokens)};
}

Usage UsageHook::usage() const {
  if (whole_ || choices_.empty()) return usage_;
  Usage sum;
  // Prompt tokens once per prompt: its choices (index / n) each said its count.
  for (std::size_t from = 0; from < choices_.size(); from += choices_per_prompt_) {
    std::uint64_t prompt = 0;
    std::uint64_t cached = 0;
    const std::size_t to = std::min<std::size_t>(choices_.size(), from + choices_per_prompt_);
    for (std::size_t i = from; i < to; ++i) {
      if (!choices_[i].seen) continue;
      prompt = std::max(prompt, choices_[i].prompt_tokens);
      cached = std::max(cached, choices_[i].cached_tokens);
      sum.completion_tokens += choices_[i].completion_tokens;
    }
    sum.prompt_tokens += prompt;
    sum.cached_tokens += cached;
  }
  sum.total_tokens = sum.prompt_tokens + sum.completion_tokens;
  return sum;
}

bool UsageHook::every_prompt() const {
  if (whole_) return true;
  // Prompt p's choices are p × n .. p × n + n − 1; one of them that said its usage said the prompt's count.
  // (Past kMaxChoices nothing is kept: such a prompt never said it here.)
  for (std::size_t p = 0; p < prompts_; ++p) {
    const std::size_t from = p * choices_per_prompt_;
    const std::size_t to = std::min<std::size_t>(choices_.size(), from + choices_per_prompt_);
    bool said = false;
    for (std::size_t i = from; i < to && !said; ++i) said = choices_[i].seen;
    if (!said) return false;
  }
  return true;
}

std::optional<std::string_view> UsageHook::without_usage(std::string_view data, std::string& out) const {
  if (!strip_ || !saw_usage_) return std::nullopt;  // (on_data's scan of this chunk)
  // Where on_data found the member, when `data` is the chunk it read; else a scan.
  const auto m = data.data() == usage_of_.data() && data.size() == usage_of_.size() ? std::optional(usage_span_)
                                                                                    : find_member(data, "usage");
  if (!m || value_text(data, *m) == "null") return std::nullopt;
  // The member and one comma beside it: the one before it, else the one after it.
  std::size_t from = m->key_begin;
  std::size_t to = m->value_end;
  std::size_t back = from;
  while (back > 0 &&
         (data[back - 1] == ' ' || data[back - 1] == '\t' || data[back - 1] == '\n' || data[back - 1] == '\r'))
    --back;
  if (back > 0 && data[back - 1] == ',') {
    from = back - 1;
  } else {
    std::size_t fwd = to;
    while (fwd < data.size() && (data[fwd] == ' ' || data[fwd] == '\t' || data[fwd] == '\n' || data[fwd] == '\r'))
      ++fwd;
    if (fwd < data.size() && data[fwd] == ',') to = fwd + 1;
  }
  out.assign(data.substr(0, from));
  out.append(data.substr(to));
  // A usage key given twice (the last one read above): every copy goes, or a client whose
  // parser keeps the first would still see one. (One more scan, only on a chunk stripped here.)
  if (find_member(out, "usage")) {
    std::string all;
    if (remove_member(data, "usage", all)) out = std::move(all);
  }
  return std::string_view(out);
}

bool completion_as_chunk(std::string_view completion, std::string& out) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(completion, ec);
  if (ec || !v.is_object()) return false;
  // An integer beyond 64 bits anywhere in the answer is kept exactly: parsed
  // again with it as a token, restored in the output (api/wide_integers.hpp).
  api::WideIntegers wide;
  std::string protected_completion;
  if (api::has_wide_integer(v))
    if (const auto text = wide.protect(completion, protected_completion); !wide.empty()) {
      v = boost::json::parse(text, ec);
      if (ec || !v.is_object()) return false;
    }
  auto& o = v.get_object();
  // (Before the pointer below: adding "object" to a body without it may
  // move the object's members.)
  o["object"] = "chat.completion.chunk";
  auto* choices = o.if_contains("choices");
  if (!choices || !choices->is_array()) return false;
  for (auto& c : choices->get_array()) {
    if (!c.is_object()) continue;
    auto& choice = c.get_object();
    boost::json::value delta = boost::json::object();
    if (auto* m = choice.if_contains("message"); m && m->is_object()) delta = std::move(*m);
    choice.erase("message");
    if (auto* calls = delta.get_object().if_contains("tool_calls"); calls && calls->is_array()) {
      std::int64_t i = 0;
      for (auto& call : calls->get_array()) {
        if (call.is_object() && !call.get_object().contains("index")) call.get_object()["index"] = i;
        ++i;
      }
    }
    choice["delta"] = std::move(delta);
  }
  // Serialized into room reserved once (the chunk is the completion's size, give or take its renamed members):
  // json::serialize's own string would be grown by doubling, then copied.
  out.clear();
  out.reserve(completion.size() + 256);
  api::append_json(out, v);
  wide.restore(out);
  return true;
}

namespace {

// A 4xx status that refuses the request (408 and 429 are the upstream's
// conditions: a timeout, an overload), from a status code's JSON value.
std::optional<bool> client_status(const boost::json::value& code) {
  std::int64_t n = 0;
  if (code.is_int64()) {
    n = code.get_int64();
  } else if (code.is_uint64()) {
    n = code.get_uint64() > 999 ? 0 : static_cast<std::int64_t>(code.get_uint64());
  } else if (code.is_string()) {
    const auto& str = code.get_string();
    if (str.size() != 3 || !std::all_of(str.begin(), str.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;  // a code word ("context_length_exceeded"): the type says
    n = (str[0] - '0') * 100 + (str[1] - '0') * 10 + (str[2] - '0');
  } else {
    return std::nullopt;
  }
  if (n < 100 || n > 599) return std::nullopt;
  return n >= 400 && n < 500 && n != 408 && n != 429;
}

}  // namespace

bool refuses_request(std::string_view error_data) {
  boost::system::error_code ec;
  const auto root = boost::json::parse(error_data, ec);
  if (ec || !root.is_object()) return false;
  const boost::json::object* err = &root.get_object();
  if (const auto* e = err->if_contains("error"); e != nullptr && e->is_object()) err = &e->get_object();
  for (const char* key : {"code", "status"}) {
    if (const auto* c = err->if_contains(key)) {
      if (const auto v = client_status(*c)) return *v;
    }
  }
  const auto* type = err->if_contains("type");
  if (type == nullptr || !type->is_string()) return false;
  // vLLM's exception names, OpenAI's and Anthropic's error types for a 4xx.
  static constexpr std::string_view kClientTypes[] = {
      "BadRequestError",     "NotFoundError",         "UnprocessableEntityError", "invalid_request_error",
      "not_found_error",     "request_too_large",     "authentication_error",     "permission_error",
      "AuthenticationError", "PermissionDeniedError", "invalid_request",
  };
  const std::string_view t(type->get_string());
  return std::find(std::begin(kClientTypes), std::end(kClientTypes), t) != std::end(kClientTypes);
}

}  // namespace weir::api::openai
