// The per-chunk translation: each upstream chunk is parsed with Boost.JSON
// into a stack arena (a chunk is a few hundred bytes), and the Anthropic
// events are written by hand with the shared JSON escaper.
#include "api/openai/stream.hpp"
#include "api/anthropic/stream.hpp"
#include "api/json_dom.hpp"
#include "api/json_scan.hpp"

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "api/anthropic/response.hpp"
#include "api/error_text.hpp"
#include "api/finish_reason.hpp"
#include "api/tool_ids.hpp"
#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::api::anthropic {

namespace json = boost::json;

namespace {

constexpr std::string_view kHeldTooLarge =
    "The upstream's parallel tool calls exceed the response size limit (server.max_response) while held.";

void begin_event(std::string& out, std::string_view type) {
  out += "event: ";
  out += type;
  out += "\ndata: ";
}

}  // namespace

void StreamTranslator::reset(std::string_view fallback_id, std::size_t held_limit, bool with_thinking) {
  *this = StreamTranslator{};
  fallback_id_ = fallback_id;
  held_limit_ = held_limit;
  with_thinking_ = with_thinking;
  calls_.reset(held_limit);
}

void StreamTranslator::start(std::string_view id, std::string_view model, std::string& out) {
  started_ = true;
  msg_id_.clear();
  // No id (or just "chatcmpl-"): the request's, so ids never collide across turns.
  if (std::string_view(id).starts_with("chatcmpl-") ? id.size() == 9 : id.empty()) id = fallback_id_;
  append_message_id(msg_id_, id);
  begin_event(out, "message_start");
  out += R"({"type":"message_start","message":{"id":)";
  core::append_json_string(out, msg_id_);
  out += R"(,"type":"message","role":"assistant","model":)";
  core::append_json_string(out, model);
  out += R"(,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{)";
  Usage u = has_usage_ ? usage_ : Usage{};
  u.completion_tokens = 0;
  append_usage_members(out, u);
  out += "}}}\n\n";
  // Anthropic's stream has a ping after message_start (its "Streaming Messages" example); clients that
  // expect the API's sequence see it. In the same buffer: the same write as message_start.
  out += "event: ping\ndata: {\"type\": \"ping\"}\n\n";
}

void StreamTranslator::open(Block kind, std::string& out) {
  open_ = kind;
  if (kind == Block::tool) {
    // (the call is calls_[tool_call_]; its start waits for its whole name: start_tool())
    tool_start_pending_ = true;
    return;
  }
  begin_event(out, "content_block_start");
  fmt::format_to(std::back_inserter(out), R"({{"type":"content_block_start","index":{},"content_block":)", next_index_);
  out += kind == Block::text ? R"({"type":"text","text":""}})" : R"({"type":"thinking","thinking":"","signature":""}})";
  out += "\n\n";
}

void StreamTranslator::start_tool(std::string& out) {
  if (!tool_start_pending_) return;
  tool_start_pending_ = false;
  // The call's id as it stands now: the upstream's, also when it came in a later delta than the call's first
  // (the start was held till now); one of Weir's only when none came before the start goes out.
  ToolCallStream::Call& c = calls_[tool_call_];
  c.id = c.upstream_id;
  if (c.id.empty()) {
    // (of the message id, which holds the client's x-request-id as it came: made an id Anthropic takes)
    c.id = fmt::format("toolu_{}_{}", std::string_view(msg_id_).substr(4), tool_call_);
    to_anthropic_tool_id(c.id);
  }
  begin_event(out, "content_block_start");
  fmt::format_to(std::back_inserter(out), R"({{"type":"content_block_start","index":{},"content_block":)", next_index_);
  out += R"({"type":"tool_use","id":)";
  core::append_json_string(out, c.id);
  out += R"(,"name":)";
  core::append_json_string(out, c.name);
  out += R"(,"input":{}}})";
  out += "\n\n";
  const std::string args = calls_.release(tool_call_);  // (what came with the name: held till now)
  tool_arguments(args, out);
}

void StreamTranslator::tool_arguments(std::string_view args, std::string& out) {
  // A tool_use block's input is an object (the Anthropic API): arguments
  // that begin with `{` stream as they come; any other text (a list, a
  // string, a bare word) is held and given at the block's end as
  // {"_raw": "<the text>"}, as the non-streamed translation does.
  args = take_arguments(tool_args_, args);
  if (tool_args_ == ToolArgs::object) {
    tool_text_.append(args);  // (checked whole at the block's end)
    delta("input_json_delta", "partial_json", args, out);
  } else if (tool_args_ == ToolArgs::raw) {
    tool_raw_.append(args);
  }
}

void StreamTranslator::close(std::string& out) {
  if (open_ == Block::none) return;
  if (open_ == Block::tool) {
    start_tool(out);
    const ToolCallStream::Call& c = calls_[tool_call_];
    calls_.set_state(tool_call_, ToolCallStream::State::done);
    // The arguments read as classify_arguments() says, as unstreamed (response.cpp) and for Responses:
    // none (whitespace, null) is input {}; JSON that is no object is {"_raw": text}. Arguments that are no
    // JSON text (cut, or garbled) are nothing the model can have meant: the client must not run the call, so
    // the stream fails, unless it is the call finish_reason "length" cut (stop_reason max_tokens): the last
    // block, none held after it; an earlier call was whole when the model went on. (Text already streamed as
    // input_json_delta cannot be taken back or wrapped as _raw.)
    const ToolArguments args = tool_args_ == ToolArgs::none
                                   ? ToolArguments::none
                                   : classify_arguments(tool_args_ == ToolArgs::object ? std::string_view(tool_text_)
                                                                                       : std::string_view(tool_raw_));
    if (args == ToolArguments::invalid && !(truncated_ && !calls_.any_held())) {
      open_ = Block::none;
      return fail(502, fmt::format("The upstream's arguments of tool call {} ({}) are not valid JSON.", c.id, c.name),
                  out);
    }
    if (tool_args_ == ToolArgs::raw && args != ToolArguments::none) {
      scratch_.assign(R"({"_raw":)");
      core::append_json_string(scratch_, tool_raw_);
      scratch_ += '}';
      delta("input_json_delta", "partial_json", scratch_, out);
    }
  }
  tool_args_ = ToolArgs::none;
  tool_raw_.clear();
  tool_text_.clear();
  begin_event(out, "content_block_stop");
  fmt::format_to(std::back_inserter(out),
                 R"({{"type":"content_block_stop","index":{}}})"
                 "\n\n",
                 next_index_);
  ++next_index_;
  open_ = Block::none;
}

bool StreamTranslator::close_all(std::string& out) {
  close(out);
  for (std::size_t i = calls_.first_held(); !ended_ && i < calls_.size(); i = calls_.first_held()) {
    calls_.set_state(i, ToolCallStream::State::streaming);
    tool_call_ = i;
    open(Block::tool, out);
    close(out);  // (the start, its arguments, the stop)
  }
  return !ended_;
}

void StreamTranslator::delta(std::string_view type, std::string_view field, std::string_view text, std::string& out) {
  begin_event(out, "content_block_delta");
  fmt::format_to(std::back_inserter(out), R"({{"type":"content_block_delta","index":{},"delta":{{"type":"{}","{}":)",
                 next_index_, type, field);
  core::append_json_string(out, text);
  out += "}}\n\n";
}

void StreamTranslator::terminate(std::string& out) {
  if (!unfinished_.empty()) return fail(502, unfinished_message(unfinished_), out);
  if (!close_all(out)) return;
  begin_event(out, "message_delta");
  out += R"({"type":"message_delta","delta":{"stop_reason":)";
  core::append_json_string(out, stop_reason_.empty() ? std::string_view("end_turn") : stop_reason_);
  out += R"(,"stop_sequence":)";
  if (stop_sequence_.empty())
    out += "null";
  else
    core::append_json_string(out, stop_sequence_);
  out += R"(},"usage":{)";
  append_usage_members(out, usage_);
  out += "}}\n\n";
  begin_event(out, "message_stop");
  out += R"({"type":"message_stop"})"
         "\n\n";
  ended_ = true;
}

void StreamTranslator::fail(int status, std::string_view message, std::string& out) {
  if (ended_) return;
  begin_event(out, "error");
  append_error_json(out, status, message);
  out += "\n\n";
  ended_ = failed_ = true;
}

void StreamTranslator::finish(std::string& out) {
  if (ended_) return;
  if (started_ && finished_) return terminate(out);
  fail(502, "The upstream stream ended before the message was complete.", out);
}

void StreamTranslator::on_data(std::string_view data, std::string& out) {
  if (ended_) return;
  // An event whose data is empty (`data:` or `data: ` alone) or blank holds no chunk: nothing to translate.
  if (data.find_first_not_of(" \t\r\n") == std::string_view::npos) return;
  if (core::is_sse_done(data)) {
    // [DONE] before any finish_reason: the answer was cut short, never a whole end_turn.
    if (started_ && finished_) return terminate(out);
    if (started_) return fail(502, "The upstream stream ended before the message was complete.", out);
    return fail(502, "The upstream stream ended before any message chunk.", out);
  }
  alignas(16) unsigned char buf[8 * 1024];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = parse_upstream_json(data, ec, &mr);
  if (ec || !v.is_object()) return fail(502, "The upstream sent a stream chunk that is not a JSON object.", out);
  const auto& chunk = v.get_object();
  if (const auto m = stream_error_message(chunk)) {  // (a refusal of the request, a 4xx in-band: the client's)
    const bool refusal = openai::refuses_request(data);
    if (const auto e = refusal ? context_length_error(*m) : std::optional<ContextLengthError>{})  // (as a whole one)
      if (const std::string anthropic = anthropic_context_length_message(*e); !anthropic.empty())
        return fail(400, anthropic, out);
    return fail(refusal ? 400 : 500, m->empty() ? std::string_view("The upstream failed while streaming.") : *m, out);
  }
  if (const auto* u = chunk.if_contains("usage"); u && u->is_object())
    if (auto parsed = extract_usage(data)) {
      usage_ = *parsed;
      has_usage_ = true;
    }
  if (!started_) {
    // A chunk with no choice and no usage says nothing (Azure's prompt_filter_results preamble: id "",
    // model ""): the message starts at the first chunk that does, with its id.
    if (says_nothing(chunk)) return;
    start(string_at(chunk, "id"), string_at(chunk, "model"), out);
  }
  const auto* choices = chunk.if_contains("choices");
  const bool usage_only = choices && choices->is_array() && choices->get_array().empty();
  if (choices && choices->is_array())
    for (const auto& c : choices->get_array()) {
      if (!c.is_object() || finished_) continue;
      const auto& choice = c.get_object();
      if (const auto* i = choice.if_contains("index"); i && i->is_number() && i->to_number<double>() != 0)
        continue;  // Anthropic has one message: only choice 0
      if (const auto* d = choice.if_contains("delta"); d && d->is_object()) {
        const auto& delta_obj = d->get_object();
        // Reasoning is a thinking block only when the client asked for thinking (as Anthropic's API): else
        // it is left out (its tokens are the usage's all the same).
        const auto thinking = [&](std::string_view piece) {
          if (!with_thinking_ || ended_) return;
          if (open_ != Block::thinking) {
            if (!close_all(out)) return;
            open(Block::thinking, out);
          }
          delta("thinking_delta", "thinking", piece, out);
        };
        const auto text = [&](std::string_view piece) {
          if (ended_) return;
          if (open_ != Block::text) {
            if (!close_all(out)) return;
            open(Block::text, out);
          }
          delta("text_delta", "text", piece, out);
        };
        std::string_view reasoning = string_at(delta_obj, "reasoning_content");
        if (reasoning.empty()) reasoning = string_at(delta_obj, "reasoning");
        if (!reasoning.empty()) thinking(reasoning);
        // The content: a string, or a list of parts (Mistral's text, magistral's thinking), each as it comes.
        for_each_content(delta_obj.if_contains("content"), text, thinking);
        if (ended_) return;
        // A refusal (hosted OpenAI's delta.refusal) is the message's text, and its stop_reason "refusal".
        if (const std::string_view refusal = string_at(delta_obj, "refusal"); !refusal.empty()) {
          if (open_ != Block::text) {
            if (!close_all(out)) return;
            open(Block::text, out);
          }
          delta("text_delta", "text", refusal, out);
          refused_ = true;
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
            const auto r = calls_.route(call, open_ == Block::tool || calls_.any_held());
            ToolCallStream::Call& c = calls_[r.call];
            if (r.began) {
              // A new call on the open call's index (a new id): the open call is whole.
              if (open_ == Block::tool && !calls_.any_held() && c.upstream_index >= 0 &&
                  calls_[tool_call_].upstream_index == c.upstream_index)
                close(out);
              if (ended_) return;
              if (open_ != Block::tool && !calls_.any_held()) {
                close(out);
                calls_.set_state(r.call, ToolCallStream::State::streaming);
                tool_call_ = r.call;
                open(Block::tool, out);
              } else {
                // Another call streams: this one is held, given whole when the tool calls end (a client
                // must never see a call end before it is complete).
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
            // Anthropic names the call once, in content_block_start: it waits (with the arguments so far)
            // until the name is whole (ToolCallStream::start_ready), or the block closes.
            switch (calls_.open_delta(r.call, tool_start_pending_, name, args)) {
              case ToolCallStream::Step::too_large:
                return fail(502, kHeldTooLarge, out);
              case ToolCallStream::Step::late_name:
                return fail(502, ToolCallStream::late_name_message(c), out);
              case ToolCallStream::Step::start:
                start_tool(out);
                break;
              case ToolCallStream::Step::arguments:
                if (!args.empty()) tool_arguments(args, out);
                break;
              case ToolCallStream::Step::held:
                break;
            }
          }
      }
      if (const std::string_view finish = string_at(choice, "finish_reason"); !finish.empty()) {
        finished_ = true;
        if (finish_of(finish) == Finish::failed) {
          // The generation did not end (vLLM's "abort", "error", ...): the stream fails where it would have
          // ended (terminate()), after the usage chunk, never with a message_delta that calls it a turn.
          keep_finish_reason(unfinished_, finish);
          continue;
        }
        truncated_ = finish == "length";
        if (!close_all(out)) return;
        const std::string_view matched = string_at(choice, "stop_reason");
        stop_reason_.assign(stop_reason(finish, matched, calls_.size() > 0));
        if (stop_reason_ == "stop_sequence") stop_sequence_.assign(matched);
        if (refused_ && stop_reason_ == "end_turn") stop_reason_.assign("refusal");
      }
    }
  // The usage chunk follows the finish chunk: then the message is complete.
  if (finished_ && usage_only && has_usage_) terminate(out);
}

}  // namespace weir::api::anthropic
