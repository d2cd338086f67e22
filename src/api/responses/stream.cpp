// The per-chunk translation: each upstream chunk is parsed with Boost.JSON
// into a stack arena (a chunk is a few hundred bytes), and the events are
// written by hand with the shared JSON escaper. The items' text is kept
// (each string grows geometrically): the .done events and the terminal
// response repeat it whole, as Responses requires.
#include "api/openai/stream.hpp"
#include "api/finish_reason.hpp"
#include "api/json_dom.hpp"
#include "api/json_scan.hpp"
#include "api/responses/stream.hpp"
#include "api/tool_ids.hpp"

#include <algorithm>
#include <ctime>

#include <iterator>

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::api::responses {

namespace json = boost::json;

namespace {

constexpr std::string_view kEnd = "}\n\n";
constexpr std::string_view kHeldTooLarge =
    "The upstream's parallel tool calls exceed the response size limit (server.max_response) while held.";

}  // namespace

void StreamTranslator::reset(std::string_view echo, std::string_view fallback_id, std::string_view fallback_model,
                             std::size_t held_limit) {
  *this = StreamTranslator{};
  calls_.reset(held_limit);
  echo_ = echo;
  fallback_id_ = fallback_id;
  fallback_model_ = fallback_model;
}

// `event: T\ndata: {"type":"T","sequence_number":N` — the caller adds the
// event's other members and kEnd.
void StreamTranslator::begin(std::string_view type, std::string& out) {
  out += "event: ";
  out += type;
  out += "\ndata: {\"type\":\"";
  out += type;
  fmt::format_to(std::back_inserter(out), R"(","sequence_number":{})", seq_++);
}

void StreamTranslator::append_item_ref(std::string& out) const {
  out += R"(,"item_id":)";
  core::append_json_string(out, items_.back().id);
  fmt::format_to(std::back_inserter(out), R"(,"output_index":{})", items_.size() - 1);
}

void StreamTranslator::start(std::string_view id, std::string_view model, std::int64_t created, std::string& out) {
  started_ = true;
  if (id.starts_with("chatcmpl-")) id.remove_prefix(9);
  if (id.empty()) id = fallback_id_;  // (no id, or just "chatcmpl-": the request's, unique)
  base_id_.assign(id);
  resp_id_.clear();
  append_id(resp_id_, "resp_", base_id_);
  model_.assign(model);
  created_ = created;
  ResponseHead head{resp_id_, created_, model_, "in_progress", {}, {}};
  for (std::string_view type : {std::string_view("response.created"), std::string_view("response.in_progress")}) {
    begin(type, out);
    out += R"(,"response":)";
    append_response_json(out, head, {}, nullptr, echo_);
    out += kEnd;
  }
}

void StreamTranslator::open(OutputItem::Kind kind, std::string& out, std::string_view call_id, std::string_view name) {
  OutputItem& it = items_.emplace_back();
  it.kind = kind;
  it.done = false;
  // Every output item has its own id (clients key items by item_id): the
  // first of a stem keeps rs_X, msg_X; a later one (reasoning, text,
  // reasoning, text; a refusal beside text) takes _1, _2, ... after it, its
  // count among the items of that stem (O(1): no search of the items). A
  // function call's fc_X_<i> is its call's position, its own.
  const auto numbered = [&](std::string_view prefix, std::size_t& count) {
    append_id(it.id, prefix, base_id_);
    if (count > 0) fmt::format_to(std::back_inserter(it.id), "_{}", count);
    ++count;
  };
  switch (kind) {
    case OutputItem::Kind::reasoning:
      numbered("rs_", reasoning_items_);
      break;
    case OutputItem::Kind::message:
    case OutputItem::Kind::refusal:
      numbered("msg_", message_items_);
      break;
    case OutputItem::Kind::function_call:
      append_id(it.id, "fc_", base_id_);
      fmt::format_to(std::back_inserter(it.id), "_{}", tool_call_);
      it.call_id.assign(call_id);
      if (it.call_id.empty()) {
        append_id(it.call_id, "call_", base_id_);
        fmt::format_to(std::back_inserter(it.call_id), "_{}", tool_call_);
        to_anthropic_tool_id(it.call_id);  // (the client's x-request-id is in it: replayable to any model)
      }
      it.name.assign(name);
      break;
  }
  open_ = true;
  begin("response.output_item.added", out);
  fmt::format_to(std::back_inserter(out), R"(,"output_index":{},"item":)", items_.size() - 1);
  append_item_json(out, it, "in_progress", false);
  out += kEnd;
  if (kind == OutputItem::Kind::function_call) return;
  begin("response.content_part.added", out);
  append_item_ref(out);
  out += kind == OutputItem::Kind::message
             ? R"(,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]})"
         : kind == OutputItem::Kind::refusal ? R"(,"content_index":0,"part":{"type":"refusal","refusal":""})"
                                             : R"(,"content_index":0,"part":{"type":"reasoning_text","text":""})";
  out += kEnd;
}

void StreamTranslator::delta(std::string_view text, std::string& out) {
  OutputItem& it = items_.back();
  it.text.append(text);
  switch (it.kind) {
    case OutputItem::Kind::reasoning:
      begin("response.reasoning_text.delta", out);
      append_item_ref(out);
      out += R"(,"content_index":0,"delta":)";
      core::append_json_string(out, text);
      break;
    case OutputItem::Kind::message:
    case OutputItem::Kind::refusal: {
      const bool refusal = it.kind == OutputItem::Kind::refusal;
      begin(refusal ? "response.refusal.delta" : "response.output_text.delta", out);
      append_item_ref(out);
      out += R"(,"content_index":0,"delta":)";
      core::append_json_string(out, text);
      if (!refusal) {
        // The chunk's logprobs (its tokens': this delta's text), and the item's for its .done events.
        out += R"(,"logprobs":[)";
        out += chunk_logprobs_;
        out += "]";
        if (!chunk_logprobs_.empty()) {
          if (!it.logprobs.empty()) it.logprobs += ',';
          it.logprobs += chunk_logprobs_;
          chunk_logprobs_.clear();
        }
      }
      break;
    }
    case OutputItem::Kind::function_call:
      begin("response.function_call_arguments.delta", out);
      append_item_ref(out);
      out += R"(,"delta":)";
      core::append_json_string(out, text);
      break;
  }
  out += kEnd;
}

void StreamTranslator::start_call(std::string& out) {
  if (!call_pending_) return;
  call_pending_ = false;
  // The upstream's id as it stands now, also when it came in a later delta than the call's first (the item was
  // held till now); "": open() makes call_X_<n>.
  ToolCallStream::Call& c = calls_[tool_call_];
  open(OutputItem::Kind::function_call, out, c.upstream_id, c.name);
  c.id = items_.back().call_id;
  const std::string args = calls_.release(tool_call_);  // (what came with the name: held till now)
  tool_arguments(args, out);
}

void StreamTranslator::tool_arguments(std::string_view args, std::string& out) {
  // As for Anthropic: arguments that begin with `{` stream as they come (whitespace before them left out);
  // any other text is held to the item's end, where classify_arguments() reads it whole.
  args = take_arguments(tool_args_, args);
  if (tool_args_ == ToolArgs::raw)
    tool_raw_.append(args);
  else if (!args.empty())
    delta(args, out);
}

void StreamTranslator::close(std::string& out) {
  start_call(out);
  if (!open_) return;
  OutputItem& it = items_.back();
  if (it.kind == OutputItem::Kind::function_call) {
    calls_.set_state(tool_call_, ToolCallStream::State::done);
    // Held text other than an object: as it is, unless it says no arguments (JSON null: "{}" below).
    if (tool_args_ == ToolArgs::raw && classify_arguments(tool_raw_) != ToolArguments::none) delta(tool_raw_, out);
    tool_args_ = ToolArgs::none;
    tool_raw_.clear();
    // Arguments that are no JSON text (cut, or garbled) are nothing the model can have meant: the client
    // must not run the call, so the response fails, unless it is the call finish_reason "length" cut: the
    // last item (none held after it), "incomplete" as the response is. An earlier call was whole when the
    // model went on, whatever the finish.
    if (!it.text.empty() && !(truncated_ && !calls_.any_held()) &&
        classify_arguments(it.text) == ToolArguments::invalid) {
      open_ = false;
      return fail(
          502,
          fmt::format("The upstream's arguments of function call {} ({}) are not valid JSON.", it.call_id, it.name),
          out);
    }
  }
  open_ = false;
  it.done = true;
  // After the finish chunk the last item (none held after it) shares the response's fate.
  const std::string_view status =
      finished_ && !incomplete_reason_.empty() && !calls_.any_held() ? "incomplete" : "completed";
  switch (it.kind) {
    case OutputItem::Kind::reasoning:
    case OutputItem::Kind::message: {
      const bool message = it.kind == OutputItem::Kind::message;
      begin(message ? "response.output_text.done" : "response.reasoning_text.done", out);
      append_item_ref(out);
      out += R"(,"content_index":0,"text":)";
      core::append_json_string(out, it.text);
      if (message) {
        out += R"(,"logprobs":[)";
        out += it.logprobs;
        out += "]";
      }
      out += kEnd;
      begin("response.content_part.done", out);
      append_item_ref(out);
      out += message ? R"(,"content_index":0,"part":{"type":"output_text","text":)"
                     : R"(,"content_index":0,"part":{"type":"reasoning_text","text":)";
      core::append_json_string(out, it.text);
      if (message) {
        out += R"(,"annotations":[],"logprobs":[)";
        out += it.logprobs;
        out += "]";
      }
      out += "}";
      out += kEnd;
      break;
    }
    case OutputItem::Kind::refusal:
      begin("response.refusal.done", out);
      append_item_ref(out);
      out += R"(,"content_index":0,"refusal":)";
      core::append_json_string(out, it.text);
      out += kEnd;
      begin("response.content_part.done", out);
      append_item_ref(out);
      out += R"(,"content_index":0,"part":{"type":"refusal","refusal":)";
      core::append_json_string(out, it.text);
      out += "}";
      out += kEnd;
      break;
    case OutputItem::Kind::function_call:
      // No arguments streamed: "{}", what OpenAI sends for a call without any (the item's JSON parses).
      if (it.text.empty()) delta("{}", out);  // (its delta too: the deltas add up to the done event's arguments)
      begin("response.function_call_arguments.done", out);
      append_item_ref(out);
      out += R"(,"name":)";
      core::append_json_string(out, it.name);
      out += R"(,"arguments":)";
      core::append_json_string(out, it.text);
      out += kEnd;
      break;
  }
  begin("response.output_item.done", out);
  fmt::format_to(std::back_inserter(out), R"(,"output_index":{},"item":)", items_.size() - 1);
  append_item_json(out, it, status);
  out += kEnd;
}

bool StreamTranslator::close_all(std::string& out) {
  close(out);
  for (std::size_t i = calls_.first_held(); !ended_ && i < calls_.size(); i = calls_.first_held()) {
    calls_.set_state(i, ToolCallStream::State::streaming);
    tool_call_ = i;
    call_pending_ = true;
    close(out);  // (added, its arguments, done)
  }
  return !ended_;
}

void StreamTranslator::terminate(std::string& out) {
  if (!unfinished_.empty()) return fail(502, unfinished_message(unfinished_), out);
  if (!close_all(out)) return;
  begin(status_ == "incomplete" ? "response.incomplete" : "response.completed", out);
  out += R"(,"response":)";
  ResponseHead head{resp_id_, created_, model_, status_, incomplete_reason_, {}};
  append_response_json(out, head, items_, has_usage_ ? &usage_ : nullptr, echo_);
  out += kEnd;
  ended_ = true;
}

void StreamTranslator::fail(int status, std::string_view message, std::string& out) {
  if (ended_) return;
  // Nothing came from the upstream: the response is this request's, created now.
  if (!started_) start(fallback_id_, fallback_model_, static_cast<std::int64_t>(std::time(nullptr)), out);
  begin("response.failed", out);
  out += R"(,"response":)";
  // Responses' stream errors carry a code, not a status: a refusal of the request (4xx) is invalid_prompt.
  ResponseHead head{resp_id_,
                    created_,
                    model_,
                    "failed",
                    {},
                    message,
                    status >= 400 && status < 500 ? "invalid_prompt" : "server_error"};
  const ResponseUsage* usage = has_usage_ ? &usage_ : nullptr;
  ResponseUsage charged;
  if ((!has_usage_ || usage_per_choice_) && charged_by_ != nullptr) {
    // One choice's counts so far, or none at all: the client is told what it is charged (the estimate of
    // a stream cut short), as its log line says.
    const auto u = charged_by_->failed_usage();
    usage = u ? &charged : nullptr;
    if (u) charged = {*u, std::min(usage_.reasoning_tokens, u->completion_tokens)};
  }
  append_response_json(out, head, items_, usage, echo_);
  out += kEnd;
  ended_ = failed_ = true;
}

void StreamTranslator::finish(std::string& out) {
  if (ended_) return;
  if (started_ && finished_) return terminate(out);
  fail(502, "The upstream stream ended before the response was complete.", out);
}

void StreamTranslator::on_data(std::string_view data, std::string& out) {
  if (ended_) return;
  // An event whose data is empty (`data:` or `data: ` alone) or blank holds no chunk: nothing to translate.
  if (data.find_first_not_of(" \t\r\n") == std::string_view::npos) return;
  if (core::is_sse_done(data)) {
    if (started_ && finished_) return terminate(out);
    return fail(502, "The upstream stream ended before the response was complete.", out);
  }
  alignas(16) unsigned char buf[8 * 1024];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = parse_upstream_json(data, ec, &mr);
  if (ec || !v.is_object()) return fail(502, "The upstream sent a stream chunk that is not a JSON object.", out);
  const auto& chunk = v.get_object();
  if (const auto m = stream_error_message(chunk))  // (a refusal of the request, a 4xx in-band: the client's)
    return fail(openai::refuses_request(data) ? 400 : 500,
                m->empty() ? std::string_view("The upstream failed while streaming.") : *m, out);
  const auto* choices = chunk.if_contains("choices");
  if (const auto* u = chunk.if_contains("usage"); u && u->is_object())
    if (auto parsed = extract_usage(data)) {
      usage_.usage = *parsed;
      has_usage_ = true;
      usage_per_choice_ = choices && choices->is_array() && !choices->get_array().empty();
      if (const auto* d = u->get_object().if_contains("completion_tokens_details"); d && d->is_object())
        if (const auto* r = d->get_object().if_contains("reasoning_tokens"); r && r->is_int64() && r->get_int64() > 0)
          usage_.reasoning_tokens = static_cast<std::uint64_t>(r->get_int64());
    }
  if (!started_) {
    // A chunk with no choice and no usage says nothing (Azure's prompt_filter_results preamble: id "",
    // model "", created 0): the response starts at the first chunk that does, with its id.
    if (says_nothing(chunk)) return;
    const auto* c = chunk.if_contains("created");
    const std::string_view id = string_at(chunk, "id");
    start(id.empty() ? fallback_id_ : id, string_at(chunk, "model"),
          c && c->is_int64() && c->get_int64() > 0 ? c->get_int64() : static_cast<std::int64_t>(std::time(nullptr)),
          out);
  }
  const bool usage_only = choices && choices->is_array() && choices->get_array().empty();
  if (choices && choices->is_array())
    for (const auto& c : choices->get_array()) {
      if (!c.is_object() || finished_) continue;
      const auto& choice = c.get_object();
      if (const auto* i = choice.if_contains("index"); i && i->is_number() && i->to_number<double>() != 0)
        continue;  // a response has one output: only choice 0
      if (const auto* d = choice.if_contains("delta"); d && d->is_object()) {
        const auto& delta_obj = d->get_object();
        const auto piece = [&](OutputItem::Kind kind, std::string_view t) {
          if (ended_) return;
          if (!open_ || items_.back().kind != kind) {
            if (!close_all(out)) return;
            open(kind, out);
          }
          delta(t, out);
        };
        std::string_view reasoning = string_at(delta_obj, "reasoning_content");
        if (reasoning.empty()) reasoning = string_at(delta_obj, "reasoning");
        if (!reasoning.empty()) piece(OutputItem::Kind::reasoning, reasoning);
        // The text's tokens' logprobs (only when the request asked for them): on its first message delta.
        chunk_logprobs_.clear();
        append_logprobs(chunk_logprobs_, choice);
        // The content: a string, or a list of parts (Mistral's text, magistral's thinking), each as it comes.
        for_each_content(
            delta_obj.if_contains("content"), [&](std::string_view t) { piece(OutputItem::Kind::message, t); },
            [&](std::string_view t) { piece(OutputItem::Kind::reasoning, t); });
        if (ended_) return;
        // The chat message's refusal (hosted OpenAI's, with structured outputs): a message with a refusal part.
        if (const std::string_view refusal = string_at(delta_obj, "refusal"); !refusal.empty()) {
          if (!open_ || items_.back().kind != OutputItem::Kind::refusal) {
            if (!close_all(out)) return;
            open(OutputItem::Kind::refusal, out);
          }
          delta(refusal, out);
        }
        if (const auto* tcs = delta_obj.if_contains("tool_calls"); tcs && tcs->is_array())
          for (const auto& tc : tcs->get_array()) {
            if (!tc.is_object()) continue;
            const auto& call = tc.get_object();
            const json::object* fn = nullptr;
            if (const auto* f = call.if_contains("function"); f && f->is_object()) fn = &f->get_object();
            const std::string_view name = fn ? string_at(*fn, "name") : std::string_view{};
            std::string unencoded;  // (arguments sent as a JSON value, not a string: its text)
            const std::string_view args = fn ? arguments_text(*fn, unencoded) : std::string_view{};
            const bool in_call = in_function_call();
            const auto r = calls_.route(call, in_call || calls_.any_held());
            ToolCallStream::Call& c = calls_[r.call];
            if (r.began) {
              // A new call on the open call's index (a new id): the open call is whole.
              if (in_call && !calls_.any_held() && c.upstream_index >= 0 &&
                  calls_[tool_call_].upstream_index == c.upstream_index)
                close(out);
              if (ended_) return;
              if (!in_function_call() && !calls_.any_held()) {
                close(out);
                calls_.set_state(r.call, ToolCallStream::State::streaming);
                tool_call_ = r.call;
                call_pending_ = true;  // (its item is added once its name is whole)
              } else {
                // Another call streams: this one is held, given whole when the calls end (a client must
                // never see a call done before it is complete).
                calls_.set_state(r.call, ToolCallStream::State::held);
                if (!calls_.hold(r.call, name, args)) return fail(502, kHeldTooLarge, out);
                continue;
              }
            } else if (c.state == ToolCallStream::State::done) {
              return fail(502, "The upstream sent more of a tool call after it had ended.", out);
            } else if (c.state == ToolCallStream::State::held) {
              if (!calls_.hold(r.call, name, args)) return fail(502, kHeldTooLarge, out);
              continue;
            }
            // output_item.added names the call, as OpenAI's does, whole: it waits (with the arguments so far)
            // until the name is whole (ToolCallStream::start_ready), or the item closes.
            switch (calls_.open_delta(r.call, call_pending_, name, args)) {
              case ToolCallStream::Step::too_large:
                return fail(502, kHeldTooLarge, out);
              case ToolCallStream::Step::late_name:
                return fail(502, ToolCallStream::late_name_message(c), out);
              case ToolCallStream::Step::start:
                start_call(out);
                break;
              case ToolCallStream::Step::arguments:
                tool_arguments(args, out);
                break;
              case ToolCallStream::Step::held:
                break;
            }
          }
      }
      if (const std::string_view finish = string_at(choice, "finish_reason"); !finish.empty()) {
        finished_ = true;
        if (finish_of(finish) == Finish::failed) {
          // The generation did not end (vLLM's "abort", "error", ...): response.failed where the stream would
          // have ended (terminate()), after the usage chunk, never response.completed.
          keep_finish_reason(unfinished_, finish);
          continue;
        }
        truncated_ = finish == "length";
        status_ = status_of(finish, incomplete_reason_);
        if (!close_all(out)) return;
      }
    }
  // The usage chunk follows the finish chunk: then the response is complete.
  if (finished_ && usage_only && has_usage_) terminate(out);
}

}  // namespace weir::api::responses
