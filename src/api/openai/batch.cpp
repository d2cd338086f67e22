#include "api/openai/batch.hpp"

#include <algorithm>
#include <array>
#include <charconv>

#include <boost/json.hpp>

#include "api/json_dom.hpp"

namespace weir::api::openai {
namespace {

std::string_view value_of(std::string_view json, const MemberSpan& m) {
  return json.substr(m.value_begin, m.value_end - m.value_begin);
}

// A member that makes a request unmergeable unless it is null or false.
bool set_and_not_off(std::string_view body, const std::optional<MemberSpan>& m) {
  if (!m) return false;
  const std::string_view v = value_of(body, *m);
  return v != "null" && v != "false";
}

// One value of a JSON text replaced: bytes [begin, end) by `with`.
struct Edit {
  std::size_t begin = 0, end = 0;
  std::string_view with;
};

// Appends `data` with `edits` (non-overlapping, in any order) applied.
void append_spliced(std::string_view data, std::span<Edit> edits, std::string& out) {
  std::sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.begin < b.begin; });
  std::size_t at = 0;
  for (const Edit& e : edits) {
    out.append(data.substr(at, e.begin - at));
    out.append(e.with);
    at = e.end;
  }
  out.append(data.substr(at));
}

std::optional<std::uint32_t> parse_index(std::string_view v) {
  std::uint32_t n = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return n;
}

// The members a batch or a coalesced generation sets or drops for all its
// members (`user`, `stream_options`, `stream`) must be what vLLM accepts
// unbatched, or merging would turn the client's 400 into a 200 (or one
// member's invalid value into everyone's 400): `user` a string or null;
// `stream_options` only with `"stream": true`, an object of boolean (or
// null) `include_usage` / `continuous_usage_stats`.
bool client_members_valid(std::string_view body) {
  static constexpr std::array<std::string_view, 3> kKeys = {"stream", "stream_options", "user"};
  std::array<std::optional<MemberSpan>, kKeys.size()> f;
  if (!find_members(body, kKeys, f)) return false;
  if (f[2]) {
    const std::string_view u = value_of(body, *f[2]);
    if (u != "null" && (u.empty() || u.front() != '"')) return false;
  }
  if (!f[1] || value_of(body, *f[1]) == "null") return true;
  if (!f[0] || value_of(body, *f[0]) != "true") return false;
  // A small object: parsed (only on pools that batch or coalesce).
  boost::system::error_code ec;
  const boost::json::value so = boost::json::parse(value_of(body, *f[1]), ec);
  if (ec || !so.is_object()) return false;
  for (const auto& kv : so.get_object()) {
    if (kv.key() != "include_usage" && kv.key() != "continuous_usage_stats") return false;
    if (!kv.value().is_bool() && !kv.value().is_null()) return false;
  }
  return true;
}

// The members of vLLM's CompletionRequest (v0.10) that change only what a non-streamed answer's choice says
// (its text, finish_reason, stop_reason) and its usage, never its shape: a non-streaming member's answer is
// assembled from the batch's stream in that shape (CompletionAssembler). Any other member that is set (not
// null or false) may add to the answer what the assembler cannot rebuild from a stream (`return_token_ids`:
// choices[].token_ids and prompt_token_ids; `kv_transfer_params`: the answer's own; a member of a later
// vLLM), so such a request is not batched. Sorted (binary search). (`n`, `best_of`, `echo`, `logprobs`,
// `prompt_logprobs`, `suffix` are checked apart: listed here, they are refused when set.)
constexpr std::array<std::string_view, 45> kShapeNeutral = {
    "add_special_tokens",
    "allowed_token_ids",
    "bad_words",
    "best_of",
    "cache_salt",
    "echo",
    "frequency_penalty",
    "guided_choice",
    "guided_decoding_backend",
    "guided_grammar",
    "guided_json",
    "guided_regex",
    "guided_whitespace_pattern",
    "ignore_eos",
    "include_stop_str_in_output",
    "length_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "min_p",
    "min_tokens",
    "model",
    "n",
    "presence_penalty",
    "priority",
    "prompt",
    "prompt_logprobs",
    "repetition_penalty",
    "request_id",
    "response_format",
    "return_tokens_as_token_ids",
    "seed",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "stop",
    "stop_token_ids",
    "stream",
    "stream_options",
    "structured_outputs",
    "suffix",
    "temperature",
    "top_k",
    "top_p",
    "truncate_prompt_tokens",
    "user",
};
static_assert(std::is_sorted(kShapeNeutral.begin(), kShapeNeutral.end()));

}  // namespace

std::optional<std::string_view> completion_batch_key(std::string_view body, std::string& key) {
  static constexpr std::array<std::string_view, 8> kKeys = {"prompt",          "n",      "best_of", "echo", "logprobs",
                                                            "prompt_logprobs", "suffix", "stream"};
  std::array<std::optional<MemberSpan>, kKeys.size()> f;
  if (!find_members(body, kKeys, f) || !client_members_valid(body)) return std::nullopt;
  const auto& prompt = f[0];
  if (!prompt || body[prompt->value_begin] != '"') return std::nullopt;
  if (f[1] && value_of(body, *f[1]) != "1" && value_of(body, *f[1]) != "null") return std::nullopt;
  for (std::size_t i = 2; i < 7; ++i)
    if (set_and_not_off(body, f[i])) return std::nullopt;
  // A non-streaming member's answer is assembled, in vLLM's non-streamed shape, from the batch's stream: only
  // a request whose answer that shape holds whole (a streaming member's chunks are the upstream's bytes).
  if ((!f[7] || value_of(body, *f[7]) != "true") && !members_known_or_off(body, kShapeNeutral)) return std::nullopt;
  std::string without_prompt;
  if (!remove_member(body, "prompt", without_prompt)) return std::nullopt;
  if (!remove_member(without_prompt, "user", key)) return std::nullopt;
  return value_of(body, *prompt);
}

void build_completion_batch(std::string_view key, std::span<const std::string_view> prompts, std::string& scratch,
                            std::string& out) {
  std::string list;
  std::size_t bytes = 2;
  for (auto p : prompts) bytes += p.size() + 1;
  list.reserve(bytes);
  list += '[';
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (i) list += ',';
    list += prompts[i];
  }
  list += ']';
  (void)set_member(key, "stream_options", R"({"include_usage":true,"continuous_usage_stats":true})", scratch);
  (void)set_member(scratch, "stream", "true", out);
  (void)set_member(out, "prompt", list, scratch);
  out.swap(scratch);
}

bool coalesce_key(std::string_view body, std::string& key) {
  static constexpr std::array<std::string_view, 5> kKeys = {"temperature", "seed", "stream_options",
                                                            "kv_transfer_params", "ec_transfer_params"};
  std::array<std::optional<MemberSpan>, kKeys.size()> f;
  if (!find_members(body, kKeys, f) || !client_members_valid(body)) return false;
  // vLLM's disaggregated serving (P/D: kv_transfer_params; E/P/D: ec_transfer_params): the answer carries the
  // request's own transfer handle (the blocks its KV cache or encoder cache was left in, its request id), which
  // one decoder pulls and frees. Shared, two decoders would pull the same blocks.
  for (const std::size_t i : {3, 4})
    if (f[i] && value_of(body, *f[i]) != "null") return false;
  bool deterministic = f[1] && value_of(body, *f[1]) != "null";
  if (f[0]) {
    double t = 1;
    const std::string_view v = value_of(body, *f[0]);
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), t);
    if (ec == std::errc() && p == v.data() + v.size() && t == 0) deterministic = true;
  }
  if (!deterministic) return false;
  if (f[2]) {
    const std::string_view so = value_of(body, *f[2]);
    if (auto c = find_member(so, "continuous_usage_stats"); c && value_of(so, *c) == "true") return false;
  }
  std::string without_user;
  if (!remove_member(body, "user", without_user)) return false;
  return remove_member(without_user, "stream_options", key);
}

void build_coalesced(std::string_view body, bool stream, std::string& scratch, std::string& out) {
  (void)remove_member(body, "user", scratch);
  if (!stream) {
    out.swap(scratch);
    return;
  }
  (void)set_member(scratch, "stream_options", R"({"include_usage":true})", out);
}

void append_with_id(std::string_view data, std::string_view id_json, std::string& out) {
  const auto id = find_member(data, "id");
  if (!id) {
    out.append(data);
    return;
  }
  out.append(data.substr(0, id->value_begin));
  out.append(id_json);
  out.append(data.substr(id->value_end));
}

namespace {

// The text of an `error` member's value, truthy as Python reads it (null, false, 0, "", {} and [] are not).
bool error_is_truthy(std::string_view v) {
  boost::system::error_code ec;
  const boost::json::value j = boost::json::parse(boost::json::string_view(v.data(), v.size()), ec);
  return !ec && truthy(j);
}

}  // namespace

BatchChunk parse_batch_chunk(std::string_view data) {
  BatchChunk c;
  static constexpr std::array<std::string_view, 6> kTop = {"id", "created", "model", "choices", "usage", "error"};
  std::array<std::optional<MemberSpan>, kTop.size()> f;
  if (!find_members(data, kTop, f)) return c;
  c.id = f[0];
  c.created = f[1];
  c.model = f[2];
  c.usage = f[4];
  // An in-band error: an `error` member that is truthy (as classify_chunk reads one), choices or not.
  if (f[5] && error_is_truthy(value_of(data, *f[5]))) {
    c.kind = BatchChunk::Kind::error;
    return c;
  }
  if (!f[3]) return c;
  const std::string_view choices = value_of(data, *f[3]);
  const auto first = first_element(choices);
  if (!first) {
    // `"choices": []`: the final usage chunk (or, without usage, nothing for anyone).
    if (choices.size() >= 2 && choices.front() == '[')
      c.kind = c.usage ? BatchChunk::Kind::usage : BatchChunk::Kind::empty;
    return c;
  }
  // One choice, no more: a chunk that carries two (two members' text) can
  // be given whole to neither.
  std::size_t after = first->end;
  while (after < choices.size() &&
         (choices[after] == ' ' || choices[after] == '\t' || choices[after] == '\n' || choices[after] == '\r'))
    ++after;
  if (after >= choices.size() || choices[after] != ']') return c;
  const std::size_t base = f[3]->value_begin + first->begin;
  const std::string_view choice = data.substr(base, first->end - first->begin);
  static constexpr std::array<std::string_view, 4> kChoice = {"index", "text", "finish_reason", "stop_reason"};
  std::array<std::optional<MemberSpan>, kChoice.size()> g;
  if (!find_members(choice, kChoice, g) || !g[0]) return c;
  const auto index = parse_index(value_of(choice, *g[0]));
  if (!index) return c;
  const auto shift = [base](std::optional<MemberSpan> m) {
    if (m) {
      m->key_begin += base;
      m->value_begin += base;
      m->value_end += base;
    }
    return m;
  };
  c.kind = BatchChunk::Kind::choice;
  c.index = *index;
  c.index_value = {base + g[0]->value_begin, base + g[0]->value_end};
  c.text = shift(g[1]);
  c.finish = shift(g[2]);
  c.stop_reason = shift(g[3]);
  return c;
}

void append_member_chunk(std::string_view data, const BatchChunk& c, std::string_view id_json,
                         std::string_view usage_json, std::string& out) {
  std::array<Edit, 3> edits{};
  std::size_t n = 0;
  if (c.id) edits[n++] = {c.id->value_begin, c.id->value_end, id_json};
  if (c.kind == BatchChunk::Kind::choice) edits[n++] = {c.index_value.begin, c.index_value.end, "0"};
  if (c.usage && !usage_json.empty()) edits[n++] = {c.usage->value_begin, c.usage->value_end, usage_json};
  append_spliced(data, std::span(edits.data(), n), out);
}

bool append_member_usage(std::string_view total, std::string_view own, std::string& out) {
  static constexpr std::array<std::string_view, 3> kNums = {"prompt_tokens", "completion_tokens", "total_tokens"};
  std::array<std::optional<MemberSpan>, 3> t, o;
  if (!find_members(total, kNums, t) || !find_members(own, kNums, o)) return false;
  for (std::size_t i = 0; i < 3; ++i)
    if (!t[i] || !o[i]) return false;
  std::array<Edit, 3> edits;
  for (std::size_t i = 0; i < 3; ++i) edits[i] = {t[i]->value_begin, t[i]->value_end, value_of(own, *o[i])};
  std::string usage, tmp;
  append_spliced(total, edits, usage);
  for (std::string_view k : {"prompt_tokens_details", "completion_tokens_details"})
    if (find_member(usage, k) && remove_member(usage, k, tmp)) usage.swap(tmp);
  out.append(usage);
  return true;
}

bool append_usage_chunk(std::string_view data, const BatchChunk& c, std::string_view id_json, std::string& out) {
  if (!c.usage || data[c.usage->value_begin] != '{') return false;
  static constexpr std::array<std::string_view, 1> kChoices = {"choices"};
  std::array<std::optional<MemberSpan>, 1> ch;
  if (!find_members(data, kChoices, ch) || !ch[0]) return false;
  // The usage object without its null members (prompt_tokens_details, completion_tokens_details).
  std::string usage(value_of(data, *c.usage)), tmp;
  for (std::string_view k : {"prompt_tokens_details", "completion_tokens_details"}) {
    if (auto m = find_member(usage, k); m && value_of(usage, *m) == "null" && remove_member(usage, k, tmp))
      usage.swap(tmp);
  }
  std::array<Edit, 3> edits{Edit{ch[0]->value_begin, ch[0]->value_end, "[]"},
                            Edit{c.usage->value_begin, c.usage->value_end, usage}, Edit{}};
  std::size_t n = 2;
  if (c.id) edits[n++] = {c.id->value_begin, c.id->value_end, id_json};
  append_spliced(data, std::span(edits.data(), n), out);
  return true;
}

void append_member_id(std::string_view upstream_id_json, std::string_view batch_request_id,
                      std::string_view member_request_id, std::uint32_t slot, std::string& out) {
  std::string_view id = upstream_id_json;
  if (id.size() >= 2 && id.front() == '"' && id.back() == '"') id = id.substr(1, id.size() - 2);
  out += '"';
  if (!batch_request_id.empty() && id.size() >= batch_request_id.size() &&
      id.substr(id.size() - batch_request_id.size()) == batch_request_id) {
    out.append(id.substr(0, id.size() - batch_request_id.size()));
    // A client's x-request-id is printable ASCII (gateway/endpoints.hpp): only '"' and '\\' need escapes.
    for (char ch : member_request_id) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
  } else {
    out.append(id);
    out += '-';
    out.append(std::to_string(slot));
  }
  out += '"';
}

void CompletionAssembler::reset() {
  text_.clear();
  created_.clear();
  model_.clear();
  finish_.clear();
  stop_reason_.clear();
  usage_.clear();
  chunks_ = 0;
}

void CompletionAssembler::on_chunk(std::string_view data, const BatchChunk& c) {
  ++chunks_;
  if (created_.empty() && c.created) created_ = value_of(data, *c.created);
  if (model_.empty() && c.model) model_ = value_of(data, *c.model);
  if (c.text) {
    const std::string_view t = value_of(data, *c.text);
    if (t.size() >= 2 && t.front() == '"') text_.append(t.substr(1, t.size() - 2));
  }
  if (c.finish) finish_ = value_of(data, *c.finish);
  if (c.stop_reason) stop_reason_ = value_of(data, *c.stop_reason);
  if (c.usage && value_of(data, *c.usage) != "null") usage_ = value_of(data, *c.usage);
}

void CompletionAssembler::on_own_total(std::string_view total) {
  if (usage_.empty()) {
    usage_ = total;
    return;
  }
  const auto d = find_member(total, "prompt_tokens_details");
  if (!d || value_of(total, *d) == "null") return;
  std::string with;
  if (set_member(usage_, "prompt_tokens_details", value_of(total, *d), with)) usage_.swap(with);
}

void CompletionAssembler::finish(std::string_view id_json, std::string& out) const {
  const auto or_null = [](const std::string& s) { return s.empty() ? std::string_view("null") : std::string_view(s); };
  out += "{\"id\":";
  out += id_json;
  out += ",\"object\":\"text_completion\",\"created\":";
  out += created_.empty() ? std::string_view("0") : std::string_view(created_);  // both views: no temporary
  out += ",\"model\":";
  out += or_null(model_);
  out += ",\"choices\":[{\"index\":0,\"text\":\"";
  out += text_;
  out += "\",\"logprobs\":null,\"finish_reason\":";
  out += or_null(finish_);
  out += ",\"stop_reason\":";
  out += or_null(stop_reason_);
  out += ",\"prompt_logprobs\":null}],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":";
  out += or_null(usage_);
  out += ",\"kv_transfer_params\":null}";
}

}  // namespace weir::api::openai
