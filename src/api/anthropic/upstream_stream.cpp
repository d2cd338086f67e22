// Per-event translation: each Anthropic event is parsed with Boost.JSON into
// a stack arena (an event is a few hundred bytes), and the chunks are
// written by hand with the shared JSON escaper into reused buffers.
#include "api/anthropic/upstream_stream.hpp"
#include "api/json_dom.hpp"

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include "api/json_write.hpp"

#include "api/anthropic/response.hpp"
#include "api/json_scan.hpp"
#include "api/wide_integers.hpp"
#include "core/json_text.hpp"

namespace weir::api::anthropic {

namespace json = boost::json;

namespace {

const json::object* object_at(const json::object& o, std::string_view name) {
  const auto* v = o.if_contains(name);
  return v ? v->if_object() : nullptr;
}

// Overwrites the counts `u` (an Anthropic usage object) carries: message_start
// has them all, message_delta the cumulative output (and, in newer API
// versions, the input counts again).
// A count that is no integer in [0, kMaxUsageTokens] (null aside) is not
// taken and makes the usage invalid: it cannot be billed as sent. Returns
// whether the count the event must say (`required`: message_start's
// input_tokens, message_delta's output_tokens) came as one that was taken:
// absent or null, that part of the usage was not reported.
bool merge_usage(const json::object& u, AnthropicUsage& into, std::string_view required) {
  bool said = false;
  auto take = [&](std::string_view name, std::uint64_t& field) {
    const auto* v = u.if_contains(name);
    if (!v || v->is_null()) return;
    if (v->is_uint64() && v->get_uint64() <= kMaxUsageTokens)
      field = v->get_uint64();
    else if (v->is_int64() && v->get_int64() >= 0 && static_cast<std::uint64_t>(v->get_int64()) <= kMaxUsageTokens)
      field = static_cast<std::uint64_t>(v->get_int64());
    else
      return void(into.invalid = true);
    if (name == required) said = true;
  };
  take("input_tokens", into.input);
  take("cache_creation_input_tokens", into.cache_creation);
  take("cache_read_input_tokens", into.cache_read);
  take("output_tokens", into.output);
  if (const auto* split = u.if_contains("cache_creation"); split && split->is_object()) {
    const auto* v = split->get_object().if_contains("ephemeral_1h_input_tokens");
    if (v && !v->is_null()) {
      if (v->is_uint64() && v->get_uint64() <= kMaxUsageTokens)
        into.cache_creation_1h = v->get_uint64();
      else if (v->is_int64() && v->get_int64() >= 0 && static_cast<std::uint64_t>(v->get_int64()) <= kMaxUsageTokens)
        into.cache_creation_1h = static_cast<std::uint64_t>(v->get_int64());
      else
        into.invalid = true;
    }
  } else if (split && !split->is_null()) {
    into.invalid = true;
  }
  return said;
}

// What a stream's usage said of its parts (usage.hpp's PartialUsage): the prompt once message_start said its
// input_tokens, the output once a message_delta said its output_tokens; nothing when a count did not read.
PartialUsage said_parts(const AnthropicUsage& u, bool prompt, bool output) {
  PartialUsage p;
  if (u.invalid) return p;
  p.prompt = prompt;
  p.completion = output;
  if (prompt)
    p.counts =
        PartialUsage::Counts(AnthropicUsage{u.input, u.cache_creation, u.cache_read, 0, u.cache_creation_1h}.openai());
  p.counts.completion_tokens = output ? PartialUsage::Counts::narrow(u.output) : 0;
  return p;
}

// The value of the top-level "type" member of an event's data (a JSON
// string without escapes in every Anthropic event type), or "".
std::string_view event_type(std::string_view data) {
  const auto span = find_member(data, "type");
  if (!span) return {};
  const std::string_view v = data.substr(span->value_begin, span->value_end - span->value_begin);
  if (v.size() < 2 || v.front() != '"' || v.back() != '"') return {};
  return v.substr(1, v.size() - 2);
}

// The JSON text of a content_block_start's tool_use `input` (`in`, parsed
// from the event's `data`). An integer beyond 64 bits in it is kept exactly
// (api/wide_integers.hpp): the event is parsed again with each such literal
// as a token, and the literals are put back into the text.
std::string input_json(std::string_view data, const json::value& in) {
  if (!has_wide_integer(in)) return to_json(in);
  WideIntegers wide;
  std::string protected_data;
  const std::string_view text = wide.protect(data, protected_data);
  if (wide.empty()) return to_json(in);  // (a literal written with an exponent: nothing to keep)
  boost::system::error_code ec;
  const json::value again = json::parse(json::string_view(text.data(), text.size()), ec);
  const json::object* cb = !ec && again.is_object() ? object_at(again.get_object(), "content_block") : nullptr;
  const json::value* input = cb ? cb->if_contains("input") : nullptr;
  if (!input) return to_json(in);  // (not reached: the same text, tokens for literals)
  std::string out = to_json(*input);
  wide.restore(out);
  return out;
}

}  // namespace

void UpstreamStreamTranslator::reset(bool include_usage, std::int64_t created) {
  include_usage_ = include_usage;
  started_ = finish_sent_ = ended_ = tool_args_sent_ = usage_final_ = prompt_said_ = usage_missing_ = false;
  block_ = Block::none;
  block_index_ = -1;
  next_tool_ = 0;
  created_ = created;
  usage_ = {};
  prefix_.clear();
  chunk_.clear();
}

void UpstreamStreamTranslator::begin_chunk() { chunk_.assign(prefix_); }

void UpstreamStreamTranslator::delta(std::string_view field, std::string_view text, ChunkSink& sink) {
  begin_chunk();
  chunk_ += R"({"index":0,"delta":{")";
  chunk_ += field;
  chunk_ += R"(":)";
  core::append_json_string(chunk_, text);
  chunk_ += R"(},"logprobs":null,"finish_reason":null}]})";
  sink.chunk(chunk_);
}

void UpstreamStreamTranslator::tool_arguments(std::string_view args, ChunkSink& sink) {
  begin_chunk();
  fmt::format_to(std::back_inserter(chunk_),
                 R"({{"index":0,"delta":{{"tool_calls":[{{"index":{},"function":{{"arguments":)", next_tool_ - 1);
  core::append_json_string(chunk_, args);
  chunk_ += R"(}}]},"logprobs":null,"finish_reason":null}]})";
  sink.chunk(chunk_);
}

void UpstreamStreamTranslator::end(ChunkSink& sink) {
  if (include_usage_ && started_) {
    begin_chunk();
    chunk_ += R"(],"usage":)";
    // (A usage the upstream did not report whole, or whose counts did not read, is no counts the client
    // would take for its own: null, as a whole answer's.)
    if (has_usage())
      append_openai_usage(chunk_, usage_.openai());
    else
      chunk_ += "null";
    chunk_ += '}';
    sink.chunk(chunk_);
  }
  sink.chunk("[DONE]");
  ended_ = true;
}

void UpstreamStreamTranslator::fail(std::string_view type, std::string_view message, ChunkSink& sink) {
  chunk_.assign(R"({"error":{"message":)");
  core::append_json_string(chunk_, message);
  chunk_ += R"(,"type":)";
  core::append_json_string(chunk_, type);
  chunk_ += R"(,"param":null,"code":null}})";
  sink.chunk(chunk_);
  sink.chunk("[DONE]");
  ended_ = true;
}

void UpstreamStreamTranslator::finish(ChunkSink& sink) {
  if (ended_) return;
  if (finish_sent_) return end(sink);
  fail("api_error", "The upstream stream ended before the message was complete.", sink);
}

void UpstreamStreamTranslator::on_data(std::string_view data, ChunkSink& sink) {
  if (ended_) return;
  // An event whose data is empty (`data:` or `data: ` alone) or blank holds no event object: nothing to read.
  if (data.find_first_not_of(" \t\r\n") == std::string_view::npos) return;
  alignas(16) unsigned char buf[8 * 1024];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = json::parse(json::string_view(data.data(), data.size()), ec, &mr);
  const json::object* ev = !ec ? v.if_object() : nullptr;
  if (!ev) return fail("api_error", "The upstream sent a stream event that is not a JSON object.", sink);
  const std::string_view type = string_at(*ev, "type");
  if (type == "error") {
    const json::object* e = object_at(*ev, "error");
    const std::string_view etype = e ? string_at(*e, "type") : std::string_view{};
    const std::string_view message = e ? string_at(*e, "message") : std::string_view{};
    return fail(etype.empty() ? std::string_view("api_error") : etype,
                message.empty() ? std::string_view("The upstream failed while streaming.") : message, sink);
  }
  if (type == "message_start") {
    if (started_) return;  // a second message_start says nothing new
    const json::object* m = object_at(*ev, "message");
    if (!m) return fail("api_error", "The upstream's message_start has no message.", sink);
    if (const json::object* u = object_at(*m, "usage")) {
      prompt_said_ = merge_usage(*u, usage_, "input_tokens");
      usage_missing_ = usage_missing_ || !prompt_said_;
    }
    started_ = true;
    prefix_.assign(R"({"id":)");
    core::append_json_string(prefix_, fmt::format("chatcmpl-{}", string_at(*m, "id")));
    fmt::format_to(std::back_inserter(prefix_), R"(,"object":"chat.completion.chunk","created":{},"model":)", created_);
    core::append_json_string(prefix_, string_at(*m, "model"));
    prefix_ += R"(,"choices":[)";
    begin_chunk();
    chunk_ += R"({"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})";
    sink.chunk(chunk_);
    return;
  }
  if (type == "ping") return;
  if (!started_) return fail("api_error", "The upstream's stream did not begin with message_start.", sink);
  if (type == "content_block_start") {
    const json::object* cb = object_at(*ev, "content_block");
    const std::string_view kind = cb ? string_at(*cb, "type") : std::string_view{};
    if (const auto* i = ev->if_contains("index"); i && i->is_int64()) block_index_ = i->get_int64();
    tool_args_sent_ = false;
    if (kind == "text") {
      block_ = Block::text;
      if (const std::string_view t = string_at(*cb, "text"); !t.empty()) delta("content", t, sink);
    } else if (kind == "thinking") {
      block_ = Block::thinking;
      if (const std::string_view t = string_at(*cb, "thinking"); !t.empty()) delta("reasoning_content", t, sink);
    } else if (kind == "tool_use") {
      block_ = Block::tool;
      begin_chunk();
      fmt::format_to(std::back_inserter(chunk_), R"({{"index":0,"delta":{{"tool_calls":[{{"index":{},"id":)",
                     next_tool_++);
      core::append_json_string(chunk_, string_at(*cb, "id"));
      chunk_ += R"(,"type":"function","function":{"name":)";
      core::append_json_string(chunk_, string_at(*cb, "name"));
      chunk_ += R"(,"arguments":""}}]},"logprobs":null,"finish_reason":null}]})";
      sink.chunk(chunk_);
      // Anthropic starts a tool with `input: {}` and streams it in
      // input_json_delta pieces; a compatible server may give the whole input
      // here instead. Kept for the block's end, used when no piece came.
      start_input_.clear();
      if (const auto* in = cb->if_contains("input"); in && in->is_object() && !in->get_object().empty())
        start_input_ = input_json(data, *in);
    } else {
      block_ = Block::other;  // redacted_thinking, server tools: no chat equivalent
    }
    return;
  }
  if (type == "content_block_delta") {
    const json::object* d = object_at(*ev, "delta");
    const std::string_view dtype = d ? string_at(*d, "type") : std::string_view{};
    if (const auto* i = ev->if_contains("index"); i && i->is_int64() && i->get_int64() != block_index_)
      return fail("api_error", "The upstream sent a delta for a content block that is not open.", sink);
    if (dtype == "text_delta") {
      if (const std::string_view t = string_at(*d, "text"); !t.empty()) delta("content", t, sink);
    } else if (dtype == "thinking_delta") {
      if (const std::string_view t = string_at(*d, "thinking"); !t.empty()) delta("reasoning_content", t, sink);
    } else if (dtype == "input_json_delta" && block_ == Block::tool) {
      if (const std::string_view a = string_at(*d, "partial_json"); !a.empty()) {
        tool_args_sent_ = true;
        tool_arguments(a, sink);
      }
    }
    return;  // signature_delta, citations_delta: nothing in chat completions
  }
  if (type == "content_block_stop") {
    if (block_ == Block::tool && !tool_args_sent_)
      tool_arguments(start_input_.empty() ? std::string_view("{}") : std::string_view(start_input_), sink);
    block_ = Block::none;
    block_index_ = -1;
    return;
  }
  if (type == "message_delta") {
    if (const json::object* u = object_at(*ev, "usage")) {
      // (An output_tokens absent or null is no count: message_start's placeholder (1) is not the output's.)
      if (merge_usage(*u, usage_, "output_tokens"))
        usage_final_ = true;
      else
        usage_missing_ = true;
    }
    if (finish_sent_) return;
    const json::object* d = object_at(*ev, "delta");
    const std::string_view stop = d ? string_at(*d, "stop_reason") : std::string_view{};
    if (stop.empty()) return;
    finish_sent_ = true;
    begin_chunk();
    chunk_ += R"({"index":0,"delta":{},"logprobs":null,"finish_reason":")";
    chunk_ += finish_reason(stop);
    chunk_ += R"("}]})";
    sink.chunk(chunk_);
    return;
  }
  if (type == "message_stop") {
    if (!finish_sent_) {  // no message_delta: the message ended without saying why
      finish_sent_ = true;
      begin_chunk();
      chunk_ += R"({"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]})";
      sink.chunk(chunk_);
    }
    return end(sink);
  }
  // Event types added later: ignored, as Anthropic's versioning policy asks of clients.
}

void PassthroughObserver::on_data(std::string_view data) {
  if (ended_) return;
  const std::string_view type = event_type(data);
  if (type == "message_stop" || type == "error") {
    ended_ = true;
    return;
  }
  if (type != "message_start" && type != "message_delta") return;
  alignas(16) unsigned char buf[4 * 1024];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = json::parse(json::string_view(data.data(), data.size()), ec, &mr);
  const json::object* ev = !ec ? v.if_object() : nullptr;
  if (!ev) return;
  const json::object* holder = type == "message_start" ? object_at(*ev, "message") : ev;
  if (const json::object* u = holder ? object_at(*holder, "usage") : nullptr) {
    if (type == "message_start") {
      if (started_) return;  // (a second message_start says nothing new)
      started_ = true;
      prompt_said_ = merge_usage(*u, usage_, "input_tokens");
      usage_missing_ = usage_missing_ || !prompt_said_;
    } else if (merge_usage(*u, usage_, "output_tokens")) {
      usage_final_ = true;
    } else {
      usage_missing_ = true;
    }
  }
}

PartialUsage UpstreamStreamTranslator::said_usage() const {
  return said_parts(usage_, started_ && prompt_said_, usage_final_);
}

PartialUsage PassthroughObserver::said_usage() const {
  return said_parts(usage_, started_ && prompt_said_, usage_final_);
}

openai::ChunkKind classify_event(std::string_view data) {
  const std::string_view type = event_type(data);
  if (type == "error") return openai::ChunkKind::error;
  if (type == "content_block_delta" || type == "message_delta" || type == "message_stop")
    return openai::ChunkKind::content;
  if (type == "content_block_start" && data.find("\"tool_use\"") != std::string_view::npos)
    return openai::ChunkKind::content;
  return openai::ChunkKind::empty;
}

}  // namespace weir::api::anthropic
