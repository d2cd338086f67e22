// Anthropic message / error → OpenAI chat.completion / error, with
// Boost.JSON (only answers of type: anthropic pools pay for it).
#include "api/anthropic/upstream_response.hpp"
#include "api/json_dom.hpp"

#include <vector>

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include "api/json_write.hpp"

#include "api/anthropic/response.hpp"
#include "api/error_text.hpp"
#include "api/json_scan.hpp"
#include "api/wide_integers.hpp"
#include "core/error.hpp"
#include "core/json_text.hpp"

namespace weir::api::anthropic {

namespace json = boost::json;

namespace {

// A count: 0 when absent or null (`*said` then false), nullopt when not an integer in [0, kMaxUsageTokens].
std::optional<std::uint64_t> count(const json::object& o, std::string_view name, bool* said = nullptr) {
  const auto* v = o.if_contains(name);
  if (said != nullptr) *said = v != nullptr && !v->is_null();
  if (!v || v->is_null()) return 0;
  if (v->is_uint64() && v->get_uint64() <= kMaxUsageTokens) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0 && static_cast<std::uint64_t>(v->get_int64()) <= kMaxUsageTokens)
    return static_cast<std::uint64_t>(v->get_int64());
  return std::nullopt;
}

// What a message's usage object says (as usage.cpp's Read): its counts, none at all, or invalid (a count that
// does not read, or input_tokens or output_tokens left out: `partial` then says the other).
enum class Read : std::uint8_t { counts, none, invalid };
Read read_usage(const json::object& u, AnthropicUsage& out, PartialUsage* partial = nullptr) {
  bool said_in = false, said_out = false, said_cc = false, said_cr = false;
  const auto in = count(u, "input_tokens", &said_in);
  const auto cc = count(u, "cache_creation_input_tokens", &said_cc);
  const auto cr = count(u, "cache_read_input_tokens", &said_cr);
  const auto out_tokens = count(u, "output_tokens", &said_out);
  // The 1-hour writes of cache_creation_input_tokens (newer API versions: {ephemeral_5m_input_tokens,
  // ephemeral_1h_input_tokens}); absent or null: none.
  std::uint64_t c1h = 0;
  const auto* split = u.if_contains("cache_creation");
  if (split && split->is_object()) {
    const auto n = count(split->get_object(), "ephemeral_1h_input_tokens");
    if (!n) return Read::invalid;
    c1h = *n;
  } else if (split && !split->is_null()) {
    return Read::invalid;
  }
  if (!in || !cc || !cr || !out_tokens) return Read::invalid;
  // No count at all ({}, every one null): the upstream reported none, as one that sent no usage.
  if (!said_in && !said_out && !said_cc && !said_cr && (!split || split->is_null())) return Read::none;
  out = AnthropicUsage{*in, *cc, *cr, *out_tokens, c1h};
  if (!said_in || !said_out) {
    // The input or the output count left out (null: a server that did not count it): that part was not
    // reported, and 0 is no count of it; the part said stands, the rest is the no-usage estimate.
    if (partial != nullptr) {
      *partial = {};
      partial->prompt = said_in;
      partial->completion = said_out;
      if (said_in) partial->counts = PartialUsage::Counts(AnthropicUsage{*in, *cc, *cr, 0, c1h}.openai());
      partial->counts.completion_tokens = said_out ? PartialUsage::Counts::narrow(*out_tokens) : 0;
    }
    return Read::invalid;
  }
  return Read::counts;
}

std::optional<AnthropicUsage> read_usage(const json::object& u) {
  AnthropicUsage out;
  if (read_usage(u, out) != Read::counts) return std::nullopt;
  return out;
}

}  // namespace

std::string_view finish_reason(std::string_view stop_reason) {
  if (stop_reason == "max_tokens" || stop_reason == "model_context_window_exceeded") return "length";
  if (stop_reason == "tool_use") return "tool_calls";
  if (stop_reason == "refusal") return "content_filter";
  return "stop";
}

void append_openai_usage(std::string& out, const Usage& u) {
  fmt::format_to(
      std::back_inserter(out),
      R"({{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":{})",
      u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_tokens);
  if (u.cache_write_tokens)
    fmt::format_to(std::back_inserter(out), R"(,"cache_write_tokens":{})", u.cache_write_tokens);
  out += "}}";
}

std::optional<Usage> extract_message_usage(std::string_view body, bool* invalid, PartialUsage* partial) {
  const auto span = find_member(body, "usage");
  if (!span) return std::nullopt;
  const std::string_view text = body.substr(span->value_begin, span->value_end - span->value_begin);
  bool ignored = false;
  bool& bad = invalid != nullptr ? *invalid : ignored;
  if (text.empty() || text.front() != '{') {
    if (text != "null") bad = true;
    return std::nullopt;
  }
  unsigned char buf[2048];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = json::parse(json::string_view(text.data(), text.size()), ec, &mr);
  AnthropicUsage u;
  const Read read = !ec && v.is_object() ? read_usage(v.get_object(), u, partial) : Read::invalid;
  if (read == Read::none) return std::nullopt;
  if (read == Read::invalid) {
    bad = true;
    return std::nullopt;
  }
  return u.openai();
}

bool message_to_chat(std::string_view body, std::int64_t created, std::string& out) {
  out.clear();
  alignas(16) unsigned char buf[16 * 1024];
  WideIntegers wide;
  std::string protected_body;
  std::string_view text = body;
  for (int pass = 0; pass < 2; ++pass) {
    json::monotonic_resource mr(buf, sizeof buf);
    json::storage_ptr sp(&mr);
    boost::system::error_code ec;
    const json::value doc = json::parse(json::string_view(text.data(), text.size()), ec, sp);
    const json::object* msg = !ec ? doc.if_object() : nullptr;
    const json::array* content = nullptr;
    if (msg)
      if (const auto* c = msg->if_contains("content"); c && c->is_array()) content = &c->get_array();
    if (!msg || !content || string_at(*msg, "type") != "message") {
      core::append_error_json(out, core::upstream_unavailable("The upstream's answer is not an Anthropic message."));
      return false;
    }
    if (pass == 0 && has_wide_integer(doc)) {
      text = wide.protect(body, protected_body);
      if (!wide.empty()) continue;
    }
    std::string texts;
    std::string thinking;
    std::string calls;  // the tool_calls array's members
    std::size_t n_calls = 0;
    bool has_text = false;
    for (const auto& b : *content) {
      const auto* block = b.if_object();
      if (!block) continue;
      const std::string_view type = string_at(*block, "type");
      if (type == "text") {
        has_text = true;
        texts += string_at(*block, "text");
      } else if (type == "thinking") {
        thinking += string_at(*block, "thinking");
      } else if (type == "tool_use") {
        if (n_calls++ > 0) calls += ',';
        calls += R"({"id":)";
        core::append_json_string(calls, string_at(*block, "id"));
        calls += R"(,"type":"function","function":{"name":)";
        core::append_json_string(calls, string_at(*block, "name"));
        calls += R"(,"arguments":)";
        const auto* input = block->if_contains("input");
        core::append_json_string(calls, input && !input->is_null() ? to_json(*input) : std::string("{}"));
        calls += "}}";
      }
      // redacted_thinking, server tool blocks and their results have no chat equivalent.
    }
    out += R"({"id":)";
    core::append_json_string(out, fmt::format("chatcmpl-{}", string_at(*msg, "id")));
    fmt::format_to(std::back_inserter(out), R"(,"object":"chat.completion","created":{},"model":)", created);
    core::append_json_string(out, string_at(*msg, "model"));
    out += R"(,"choices":[{"index":0,"message":{"role":"assistant","content":)";
    if (has_text)
      core::append_json_string(out, texts);
    else
      out += "null";
    out += R"(,"refusal":null)";
    if (!thinking.empty()) {
      out += R"(,"reasoning_content":)";
      core::append_json_string(out, thinking);
    }
    if (n_calls > 0) {
      out += R"(,"tool_calls":[)";
      out += calls;
      out += ']';
    }
    out += R"(},"logprobs":null,"finish_reason":)";
    core::append_json_string(out, finish_reason(string_at(*msg, "stop_reason")));
    out += R"(}],"usage":)";
    std::optional<AnthropicUsage> u;
    if (const auto* uv = msg->if_contains("usage"); uv && uv->is_object()) u = read_usage(uv->get_object());
    // (None that reads: `null`, the upstream's silence, not counts of 0 a chat or Responses client would take
    // for its own; the request is charged its estimate: docs/admission.md, "No usage reported".)
    if (u)
      append_openai_usage(out, u->openai());
    else
      out += "null";
    out += '}';
    wide.restore(out);
    return true;
  }
  return false;  // not reached
}

namespace {

void append_event(std::string& out, std::string_view type, const json::object& data) {
  out += "event: ";
  out += type;
  out += "\ndata: ";
  out += to_json(data);
  out += "\n\n";
}

}  // namespace

bool message_as_events(std::string_view body, std::string& out, std::uint32_t& deltas) {
  out.clear();
  deltas = 0;
  WideIntegers wide;
  std::string protected_body;
  std::string_view text = body;
  for (int pass = 0; pass < 2; ++pass) {
    boost::system::error_code ec;
    json::value doc = json::parse(json::string_view(text.data(), text.size()), ec);
    json::object* msg = !ec ? doc.if_object() : nullptr;
    json::array* content = nullptr;
    if (msg)
      if (auto* c = msg->if_contains("content"); c && c->is_array()) content = &c->get_array();
    if (!msg || !content || string_at(*msg, "type") != "message") return false;
    if (pass == 0 && has_wide_integer(doc)) {
      text = wide.protect(body, protected_body);
      if (!wide.empty()) continue;
    }
    json::array blocks = std::move(*content);
    json::object start = *msg;
    start["content"] = json::array();
    start["stop_reason"] = nullptr;
    start["stop_sequence"] = nullptr;
    if (auto* u = start.if_contains("usage"); u && u->is_object()) u->get_object()["output_tokens"] = 0;
    append_event(out, "message_start", json::object{{"type", "message_start"}, {"message", std::move(start)}});
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (!blocks[i].is_object()) continue;
      json::object block = std::move(blocks[i].get_object());
      const std::string type(string_at(block, "type"));
      std::vector<json::object> delta;
      if (type == "text") {
        delta.push_back({{"type", "text_delta"}, {"text", block["text"]}});
        block["text"] = "";
      } else if (type == "thinking") {
        delta.push_back({{"type", "thinking_delta"}, {"thinking", block["thinking"]}});
        if (const auto* sig = block.if_contains("signature"); sig && sig->is_string())
          delta.push_back({{"type", "signature_delta"}, {"signature", *sig}});
        block["thinking"] = "";
        block.erase("signature");
      } else if (type == "tool_use" || type == "server_tool_use") {
        const auto* input = block.if_contains("input");
        delta.push_back({{"type", "input_json_delta"},
                         {"partial_json", input && !input->is_null() ? to_json(*input) : std::string("{}")}});
        block["input"] = json::object();
      }
      const auto index = static_cast<std::uint64_t>(i);
      append_event(
          out, "content_block_start",
          json::object{{"type", "content_block_start"}, {"index", index}, {"content_block", std::move(block)}});
      for (auto& d : delta) {
        append_event(out, "content_block_delta",
                     json::object{{"type", "content_block_delta"}, {"index", index}, {"delta", std::move(d)}});
        ++deltas;
      }
      append_event(out, "content_block_stop", json::object{{"type", "content_block_stop"}, {"index", index}});
    }
    json::object md{
        {"type", "message_delta"},
        {"delta", json::object{{"stop_reason", msg->contains("stop_reason") ? (*msg)["stop_reason"] : nullptr},
                               {"stop_sequence", msg->contains("stop_sequence") ? (*msg)["stop_sequence"] : nullptr}}}};
    if (const auto* u = msg->if_contains("usage"); u && u->is_object()) md["usage"] = *u;
    append_event(out, "message_delta", md);
    append_event(out, "message_stop", json::object{{"type", "message_stop"}});
    wide.restore(out);
    return true;
  }
  return false;  // not reached
}

void append_openai_error(std::string& out, int status, std::string_view body) {
  unsigned char buf[4096];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = json::parse(json::string_view(body.data(), body.size()), ec, &mr);
  std::string_view message;
  std::string_view type;
  if (!ec && v.is_object()) {
    const auto& o = v.get_object();
    if (const auto* e = o.if_contains("error"); e && e->is_object()) {
      message = string_at(e->get_object(), "message");
      type = string_at(e->get_object(), "type");
    }
    if (message.empty()) message = string_at(o, "message");
  }
  const std::string text = message.empty() ? upstream_error_text(status, body) : std::string(message);
  // Anthropic's "prompt is too long: ..." is OpenAI's context_length_exceeded (clients compare the code).
  const bool context_length = status >= 400 && status < 500 && context_length_error(text).has_value();
  out += R"({"error":{"message":)";
  core::append_json_string(out, text);
  out += R"(,"type":)";
  core::append_json_string(out, context_length ? "invalid_request_error" : type.empty() ? error_type(status) : type);
  out +=
      context_length ? R"(,"param":"messages","code":"context_length_exceeded"}})" : R"(,"param":null,"code":null}})";
}

}  // namespace weir::api::anthropic
