// Response objects written by hand with the shared JSON escaper (the stream
// writes one per terminal event); a non-streaming chat.completion is read
// with Boost.JSON into a stack arena.
#include "api/responses/response.hpp"
#include "api/json_dom.hpp"
#include "api/json_scan.hpp"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <iterator>
#include <vector>

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "api/error_text.hpp"
#include "api/finish_reason.hpp"
#include "api/json_write.hpp"
#include "api/tool_call_stream.hpp"
#include "api/tool_ids.hpp"
#include "core/error.hpp"
#include "core/json_text.hpp"

namespace weir::api::responses {

namespace json = boost::json;

namespace {

// An upstream error's `param` in the Responses request's terms: the chat-completions member Weir translated a
// Responses field into names that field (max_tokens and max_completion_tokens: max_output_tokens; messages:
// input; response_format: text), also with a path after it ("messages[3].content": "input", as the
// translated messages' positions are not the input's items); any other param as it came.
std::string_view responses_param(std::string_view param) {
  static constexpr std::pair<std::string_view, std::string_view> kFields[] = {
      {"max_tokens", "max_output_tokens"},
      {"max_completion_tokens", "max_output_tokens"},
      {"messages", "input"},
      {"response_format", "text"},
  };
  for (const auto& [chat, responses] : kFields)
    if (param.starts_with(chat) &&
        (param.size() == chat.size() || param[chat.size()] == '.' || param[chat.size()] == '['))
      return responses;
  return param;
}

}  // namespace

void append_logprobs(std::string& out, const json::object& choice) {
  const auto* lp = choice.if_contains("logprobs");
  if (!lp || !lp->is_object()) return;
  const auto* content = lp->get_object().if_contains("content");
  if (!content || !content->is_array()) return;
  for (const auto& entry : content->get_array()) {
    if (!entry.is_object()) continue;
    if (!out.empty()) out += ',';
    append_json(out, entry);
  }
}

void append_id(std::string& out, std::string_view prefix, std::string_view upstream_id) {
  if (upstream_id.starts_with("chatcmpl-")) upstream_id.remove_prefix(9);
  out += prefix;
  out += upstream_id;
}

std::string_view status_of(std::string_view finish_reason, std::string_view& incomplete_reason) {
  incomplete_reason = {};
  const Finish f = finish_of(finish_reason);
  if (f == Finish::length) incomplete_reason = "max_output_tokens";
  if (f == Finish::content_filter) incomplete_reason = "content_filter";
  return incomplete_reason.empty() ? std::string_view("completed") : std::string_view("incomplete");
}

void append_item_json(std::string& out, const OutputItem& item, std::string_view status, bool with_content) {
  const std::string_view text = with_content ? std::string_view(item.text) : std::string_view{};
  switch (item.kind) {
    case OutputItem::Kind::reasoning:
      out += R"({"id":)";
      core::append_json_string(out, item.id);
      out += R"(,"type":"reasoning","summary":[],"content":[)";
      if (with_content) {
        out += R"({"type":"reasoning_text","text":)";
        core::append_json_string(out, text);
        out += "}";
      }
      out += R"(],"status":")";
      break;
    case OutputItem::Kind::message:
    case OutputItem::Kind::refusal: {  // a message item: its one part is output text or a refusal
      const bool refusal = item.kind == OutputItem::Kind::refusal;
      out += R"({"id":)";
      core::append_json_string(out, item.id);
      out += R"(,"type":"message","role":"assistant","content":[)";
      if (with_content) {
        out += refusal ? R"({"type":"refusal","refusal":)" : R"({"type":"output_text","text":)";
        core::append_json_string(out, text);
        if (refusal) {
          out += "}";
        } else {
          out += R"(,"annotations":[],"logprobs":[)";
          out += item.logprobs;
          out += "]}";
        }
      }
      out += R"(],"status":")";
      break;
    }
    case OutputItem::Kind::function_call:
      out += R"({"id":)";
      core::append_json_string(out, item.id);
      out += R"(,"type":"function_call","call_id":)";
      core::append_json_string(out, item.call_id);
      out += R"(,"name":)";
      core::append_json_string(out, item.name);
      out += R"(,"arguments":)";
      core::append_json_string(out, text);
      out += R"(,"status":")";
      break;
  }
  out += status;
  out += "\"}";
}

void append_usage_json(std::string& out, const ResponseUsage& u) {
  const std::uint64_t total =
      u.usage.total_tokens ? u.usage.total_tokens : u.usage.prompt_tokens + u.usage.completion_tokens;
  fmt::format_to(std::back_inserter(out),
                 R"({{"input_tokens":{},"input_tokens_details":{{"cached_tokens":{},"cache_write_tokens":{}}},)"
                 R"("output_tokens":{},"output_tokens_details":{{"reasoning_tokens":{}}},"total_tokens":{}}})",
                 u.usage.prompt_tokens, u.usage.cached_tokens, u.usage.cache_write_tokens, u.usage.completion_tokens,
                 u.reasoning_tokens, total);
}

void append_response_json(std::string& out, const ResponseHead& head, std::span<const OutputItem> items,
                          const ResponseUsage* usage, std::string_view echo) {
  out += R"({"id":)";
  core::append_json_string(out, head.id);
  fmt::format_to(std::back_inserter(out), R"(,"object":"response","created_at":{},"completed_at":)", head.created_at);
  // Written as the response completes: now (never before created_at, the upstream's clock).
  if (head.status == "completed")
    fmt::format_to(std::back_inserter(out), "{}",
                   std::max(head.created_at, static_cast<std::int64_t>(std::time(nullptr))));
  else
    out += "null";
  out += R"(,"status":")";
  out += head.status;
  out += R"(","error":)";
  if (head.status == "failed") {
    out += R"({"code":)";
    core::append_json_string(out, head.error_code);
    out += R"(,"message":)";
    core::append_json_string(out, head.error_message);
    out += "}";
  } else {
    out += "null";
  }
  out += R"(,"incomplete_details":)";
  if (head.incomplete_reason.empty()) {
    out += "null";
  } else {
    out += R"({"reason":")";
    out += head.incomplete_reason;
    out += "\"}";
  }
  out += R"(,"model":)";
  core::append_json_string(out, head.model);
  out += R"(,"output":[)";
  const bool in_progress = head.status == "in_progress";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += ",";
    std::string_view status = "completed";
    if (in_progress) status = "in_progress";
    if (head.status == "incomplete" && i + 1 == items.size()) status = "incomplete";
    if (head.status == "failed" && !items[i].done) status = "incomplete";
    append_item_json(out, items[i], status);
  }
  out += R"(],"usage":)";
  if (usage)
    append_usage_json(out, *usage);
  else
    out += "null";
  if (!echo.empty()) {
    out += ",";
    out += echo;
  }
  out += "}";
}

Translated translate_response(std::string_view body, std::string_view echo, std::string_view fallback_id,
                              std::string& out) {
  out.clear();
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
  if (!msg) return Translated::not_a_completion;
  // A generation the upstream ended without finishing it (vLLM's "abort", "error", "repetition", a value no
  // mapping knows: finish_reason.hpp) is never a completed response.
  if (const std::string_view finish = string_at(*choice, "finish_reason"); finish_of(finish) == Finish::failed) {
    keep_finish_reason(out, finish);
    return Translated::unfinished;
  }
  const auto& root = doc.get_object();
  // An upstream that gives no id (an OpenAI-compatible server other than
  // vLLM): the request's, as the stream translator takes it, so every
  // Response and item id stays unique.
  std::string_view upstream_id = string_at(root, "id");
  if (upstream_id.empty() || upstream_id == "chatcmpl-") upstream_id = fallback_id;
  std::vector<OutputItem> items;
  // The content: a string, or a list of parts (Mistral's: text, and magistral's thinking first) whose text
  // pieces are the message, its thinking pieces the reasoning after vLLM's reasoning_content.
  JoinedText reasoning, text;
  read_message_text(*msg, reasoning, text);
  if (!reasoning.view().empty()) {
    OutputItem& it = items.emplace_back();
    it.kind = OutputItem::Kind::reasoning;
    append_id(it.id, "rs_", upstream_id);
    it.text = reasoning.view();
  }
  if (!text.view().empty()) {
    OutputItem& it = items.emplace_back();
    append_id(it.id, "msg_", upstream_id);
    it.text = text.view();
    append_logprobs(it.logprobs, *choice);
  }
  if (const std::string_view refusal = string_at(*msg, "refusal"); !refusal.empty()) {
    OutputItem& it = items.emplace_back();
    it.kind = OutputItem::Kind::refusal;
    append_id(it.id, "msg_", upstream_id);
    if (items.size() > 1 && items[items.size() - 2].id == it.id) it.id += "_1";  // (beside a text message)
    it.text = refusal;
  }
  const std::string_view finish_reason = string_at(*choice, "finish_reason");
  // The first function call whose arguments are no JSON text (its item's position), if any.
  std::size_t garbled = SIZE_MAX;
  if (const auto* tc = msg->if_contains("tool_calls"); tc && tc->is_array()) {
    std::size_t n = 0;
    for (const auto& call : tc->get_array()) {
      if (!call.is_object()) continue;
      const auto* fn = call.get_object().if_contains("function");
      if (!fn || !fn->is_object()) continue;
      OutputItem& it = items.emplace_back();
      it.kind = OutputItem::Kind::function_call;
      append_id(it.id, "fc_", upstream_id);
      fmt::format_to(std::back_inserter(it.id), "_{}", n);
      it.call_id = string_at(call.get_object(), "id");
      if (it.call_id.empty()) {
        append_id(it.call_id, "call_", upstream_id);
        fmt::format_to(std::back_inserter(it.call_id), "_{}", n);
        to_anthropic_tool_id(it.call_id);  // (the client's x-request-id is in it: replayable to any model)
      }
      it.name = string_at(fn->get_object(), "name");
      std::string storage;
      it.text = arguments_text(fn->get_object(), storage);  // (an unencoded object: its JSON text)
      // No arguments (none, whitespace, JSON null: classify_arguments, as the stream and Messages read them):
      // "{}", as OpenAI gives a call without arguments.
      const ToolArguments read = classify_arguments(it.text);
      if (read == ToolArguments::none) it.text = "{}";
      if (read == ToolArguments::invalid && garbled == SIZE_MAX) garbled = items.size() - 1;
      ++n;
    }
  }
  // Arguments that are no JSON text are nothing the model can have meant: the client must not run the call
  // (as the stream fails), unless it is the call the finish "length" cut: the last item (the response is
  // incomplete, and so is that item). An earlier call's garbled arguments were whole when the model went on.
  if (garbled != SIZE_MAX && (finish_reason != "length" || garbled + 1 != items.size())) {
    const OutputItem& it = items[garbled];
    out = fmt::format("function call {} ({})", core::utf8_prefix(it.call_id, core::kMaxEchoBytes),
                      core::utf8_prefix(it.name, core::kMaxEchoBytes));
    return Translated::invalid_arguments;
  }
  std::string id;
  append_id(id, "resp_", upstream_id);
  ResponseHead head;
  head.id = id;
  if (const auto* c = root.if_contains("created"); c && c->is_int64() && c->get_int64() > 0)
    head.created_at = c->get_int64();
  else
    head.created_at = static_cast<std::int64_t>(std::time(nullptr));  // (as the stream translator)
  head.model = string_at(root, "model");
  head.status = status_of(finish_reason, head.incomplete_reason);
  // No usage upstream (or counts that do not read): `usage: null`, as the
  // stream says it, not zero tokens for a request that was charged.
  const auto counts = extract_usage(body);
  ResponseUsage usage;
  usage.usage = counts.value_or(Usage{});
  if (const auto* u = root.if_contains("usage"); u && u->is_object())
    if (const auto* d = u->get_object().if_contains("completion_tokens_details"); d && d->is_object())
      if (const auto* r = d->get_object().if_contains("reasoning_tokens"); r && r->is_int64() && r->get_int64() > 0)
        usage.reasoning_tokens = static_cast<std::uint64_t>(r->get_int64());
  // (Room for it reserved once: the items' text is most of the answer, and
  // appends growing it by doubling would copy tens of MB over again.)
  out.reserve(body.size() + echo.size() + 1024);
  append_response_json(out, head, items, counts ? &usage : nullptr, echo);
  return Translated::ok;
}

void append_upstream_error(std::string& out, int status, std::string_view body) {
  append_openai_error_for(out, status, body, responses_param);
}

}  // namespace weir::api::responses
