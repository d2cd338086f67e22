// OpenAI chat.completion / vLLM answers → Anthropic message, count and
// error bodies, with Boost.JSON (only /v1/messages responses pay for it).
#include "api/anthropic/response.hpp"
#include "api/json_dom.hpp"
#include "api/json_scan.hpp"

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "api/error_text.hpp"
#include "api/finish_reason.hpp"
#include "api/json_write.hpp"
#include "api/tool_call_stream.hpp"
#include "api/tool_ids.hpp"
#include "api/wide_integers.hpp"
#include "core/json_text.hpp"

namespace weir::api::anthropic {

namespace json = boost::json;

namespace {

// The input of a tool_use block: the arguments JSON when it is an object
// (integers beyond 64 bits kept as `wide`'s tokens); {} for none (empty,
// whitespace, JSON null); else {"_raw": text} (classify_arguments, as the
// stream and Responses read them).
json::value tool_input(std::string_view args, json::storage_ptr sp, WideIntegers& wide) {
  if (classify_arguments(args) == ToolArguments::none) return json::object(sp);
  boost::system::error_code ec;
  std::string storage;
  const std::string_view text = wide.protect(args, storage);
  json::parse_options opt;
  opt.max_depth = 64;  // as request bodies are read (api/request.cpp): a deep schema-shaped input stays an object
  json::value v = json::parse(json::string_view(text.data(), text.size()), ec, sp, opt);
  if (!ec && v.is_object()) return v;
  return json::object({{"_raw", args}}, sp);
}

}  // namespace

std::string_view error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 402:
      return "billing_error";
    case 429:
      return "rate_limit_error";
    case 504:
      return "timeout_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

void append_error_json(std::string& out, int status, std::string_view message) {
  out += R"({"type":"error","error":{"type":")";
  out += error_type(status);
  out += R"(","message":)";
  core::append_json_string(out, message);
  out += "}}";
}

void append_upstream_error(std::string& out, int status, std::string_view body) {
  std::string message = upstream_error_text(status, body);
  if (status >= 400 && status < 500)
    if (const auto e = context_length_error(message))
      if (std::string anthropic = anthropic_context_length_message(*e); !anthropic.empty())
        message = std::move(anthropic);
  append_error_json(out, status, message);
}

void append_message_id(std::string& out, std::string_view upstream_id) {
  if (upstream_id.starts_with("chatcmpl-")) upstream_id.remove_prefix(9);
  out += "msg_";
  out += upstream_id;
}

std::string_view stop_reason(std::string_view finish_reason, std::string_view matched_stop, bool tool_calls) {
  const Finish f = finish_of(finish_reason);
  if (f == Finish::length) return "max_tokens";
  if (tool_calls) return "tool_use";
  if (f == Finish::content_filter) return "refusal";
  if (finish_reason == "stop" && !matched_stop.empty()) return "stop_sequence";
  return "end_turn";
}

void append_usage_members(std::string& out, const Usage& u) {
  const std::uint64_t cached = std::min(u.cached_tokens, u.prompt_tokens);
  fmt::format_to(std::back_inserter(out), R"("input_tokens":{},"output_tokens":{},"cache_read_input_tokens":{})",
                 u.prompt_tokens - cached, u.completion_tokens, cached);
}

bool translate_message(std::string_view body, std::string& out, std::string_view fallback_id, bool with_thinking,
                       std::string* unfinished) {
  out.clear();
  if (unfinished) unfinished->clear();
  alignas(16) unsigned char buf[16 * 1024];
  json::monotonic_resource mr(buf, sizeof buf);
  json::storage_ptr sp(&mr);
  boost::system::error_code ec;
  const json::value doc = parse_upstream_json(body, ec, sp);
  const json::object* choice = nullptr;
  const json::object* msg = nullptr;
  if (!ec && doc.is_object())
    if (const auto* cs = doc.get_object().if_contains("choices"); cs && cs->is_array() && !cs->get_array().empty())
      if (const auto& c = cs->get_array()[0]; c.is_object()) {
        choice = &c.get_object();
        if (const auto* m = choice->if_contains("message"); m && m->is_object()) msg = &m->get_object();
      }
  if (!msg) {
    append_error_json(out, 502, "The upstream's answer is not a chat completion.");
    return false;
  }
  // A generation the upstream ended without finishing it (vLLM's "abort", "error", "repetition", a value no
  // mapping knows: finish_reason.hpp) is no message: Anthropic's answer for it is an error, never end_turn.
  if (const std::string_view finish = string_at(*choice, "finish_reason"); finish_of(finish) == Finish::failed) {
    if (unfinished) keep_finish_reason(*unfinished, finish);
    append_error_json(out, 502, unfinished_message(finish));
    return false;
  }
  const auto& root = doc.get_object();
  std::string id;
  // No id (or just "chatcmpl-"): the request's, so message and tool ids never collide across turns.
  std::string_view upstream_id = string_at(root, "id");
  if (upstream_id.empty() || upstream_id == "chatcmpl-") upstream_id = fallback_id;
  append_message_id(id, upstream_id);

  // The message is written by hand into room reserved once (an answer's
  // text is most of its size): serializing a DOM copy of it would grow the
  // output by doubling and copy the text twice more (tens of MB for a long
  // answer, all on the worker's thread).
  out.reserve(body.size() + 1024);
  out += R"({"id":)";
  core::append_json_string(out, id);
  out += R"(,"type":"message","role":"assistant","model":)";
  core::append_json_string(out, string_at(root, "model"));
  out += R"(,"content":[)";
  bool first = true;
  const auto block = [&](std::string_view head) {
    if (!first) out += ',';
    first = false;
    out += head;
  };
  WideIntegers wide;
  // The content: a string, or a list of parts (Mistral's: text, and magistral's thinking first) whose text
  // pieces are the text, its thinking pieces the reasoning after vLLM's reasoning_content.
  JoinedText thinking, text;
  read_message_text(*msg, thinking, text);
  // A thinking block only when the client asked for thinking: Anthropic gives none otherwise, and a client
  // reads content[0].text (a reasoning model's server, vLLM with a reasoning parser, sends it always).
  if (with_thinking && !thinking.view().empty()) {
    block(R"({"type":"thinking","thinking":)");
    core::append_json_string(out, thinking.view());
    out += R"(,"signature":""})";
  }
  if (!text.view().empty()) {
    block(R"({"type":"text","text":)");
    core::append_json_string(out, text.view());
    out += '}';
  }
  // A refusal (hosted OpenAI's message.refusal) is the message's text, with stop_reason "refusal".
  const std::string_view refusal = string_at(*msg, "refusal");
  if (!refusal.empty()) {
    block(R"({"type":"text","text":)");
    core::append_json_string(out, refusal);
    out += '}';
  }
  bool tool_calls = false;
  if (const auto* tc = msg->if_contains("tool_calls"); tc && tc->is_array()) {
    std::size_t i = 0;
    for (const auto& call : tc->get_array()) {
      if (!call.is_object()) continue;
      const auto* fn = call.get_object().if_contains("function");
      if (!fn || !fn->is_object()) continue;
      std::string call_id(string_at(call.get_object(), "id"));
      if (call_id.empty()) {
        // Weir's own: made of the message id, which holds the client's x-request-id as it came; made an id
        // Anthropic takes (api/tool_ids.hpp), as the conversation may be replayed to an Anthropic model.
        call_id = fmt::format("toolu_{}_{}", std::string_view(id).substr(4), i);
        to_anthropic_tool_id(call_id);
      }
      block(R"({"type":"tool_use","id":)");
      core::append_json_string(out, call_id);
      out += R"(,"name":)";
      core::append_json_string(out, string_at(fn->get_object(), "name"));
      out += R"(,"input":)";
      std::string unencoded;  // (arguments sent as a JSON value, not a string: its text)
      append_json(out, tool_input(arguments_text(fn->get_object(), unencoded), sp, wide));
      out += '}';
      tool_calls = true;
      ++i;
    }
  }
  const std::string_view finish = string_at(*choice, "finish_reason");
  // vLLM's stop_reason: the matched stop string, a stop token id (a number), or null.
  const std::string_view matched = string_at(*choice, "stop_reason");
  std::string_view reason = stop_reason(finish, matched, tool_calls);
  if (!refusal.empty() && reason == "end_turn") reason = "refusal";
  out += R"(],"stop_reason":")";
  out += reason;
  out += R"(","stop_sequence":)";
  if (reason == "stop_sequence")
    core::append_json_string(out, matched);
  else
    out += "null";
  // The usage from the one usage reader.
  out += R"(,"usage":{)";
  append_usage_members(out, extract_usage(body).value_or(Usage{}));
  out += "}}";
  wide.restore(out);
  return true;
}

bool translate_count(std::string_view body, std::string& out) {
  out.clear();
  unsigned char buf[4096];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  // Only the top level is needed, but `tokens` can be long: parse it whole.
  const json::value v = json::parse(json::string_view(body.data(), body.size()), ec, &mr);
  if (!ec && v.is_object())
    if (const auto* c = v.get_object().if_contains("count"); c && (c->is_int64() || c->is_uint64())) {
      out = fmt::format(R"({{"input_tokens":{}}})", c->to_number<std::int64_t>());
      return true;
    }
  append_error_json(out, 502, "The upstream's /tokenize answer has no count.");
  return false;
}

}  // namespace weir::api::anthropic
