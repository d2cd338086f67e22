#include "gateway/phases/made_stream.hpp"

#include "api/anthropic/stream.hpp"
#include "api/json_scan.hpp"
#include "api/openai/stream.hpp"
#include "api/responses/stream.hpp"
#include "gateway/generation.hpp"
#include "http/sse.hpp"

namespace weir::gateway {

void append_as_openai_stream(std::string_view chunk, bool with_usage, std::string& out) {
  std::string usage, bare;
  if (const auto u = api::find_member(chunk, "usage"))
    usage = chunk.substr(u->value_begin, u->value_end - u->value_begin);
  if (!usage.empty() && api::remove_member(chunk, "usage", bare)) chunk = bare;
  out.reserve(out.size() + chunk.size() + 2 * usage.size() + 256);  // (once: a long answer's chunk is its size)
  out.append("data: ").append(chunk).append("\n\n");
  if (with_usage && !usage.empty() && usage != "null") {
    out += "data: {";
    for (const std::string_view key : {"id", "object", "created", "model"}) {
      const auto m = api::find_member(chunk, key);
      if (!m) continue;
      out.append("\"").append(key).append("\":").append(chunk.substr(m->value_begin, m->value_end - m->value_begin));
      out += ',';
    }
    out.append("\"choices\":[],\"usage\":").append(usage).append("}\n\n");
  }
  out.append("data: [DONE]\n\n");
}

bool whole_answer_as_stream(std::string_view chat, Translation client, const RequestContext& ctx, bool with_usage,
                            std::string& out, std::string& chunk, std::string* unfinished) {
  if (!api::openai::completion_as_chunk(chat, chunk)) return false;
  switch (client) {
    case Translation::none:
      append_as_openai_stream(chunk, with_usage, out);
      return true;
    case Translation::anthropic: {
      // Its events carry the text once, as the chunk does: room for them reserved once. (A Responses
      // stream carries it in several events: its own growth sizes it.)
      out.reserve(out.size() + chunk.size() + 4096);
      api::anthropic::StreamTranslator tr;
      tr.reset(ctx.upstream_id(), api::anthropic::StreamTranslator::kHeldLimit, ctx.fields.thinking);
      tr.on_data(chunk, out);
      tr.finish(out);
      if (unfinished) unfinished->assign(tr.unfinished());
      return !tr.failed();
    }
    case Translation::responses: {
      api::responses::StreamTranslator tr;
      tr.reset(ctx.responses_echo(), ctx.upstream_id(), ctx.model);
      tr.on_data(chunk, out);
      tr.finish(out);
      if (unfinished) unfinished->assign(tr.unfinished());
      return !tr.failed();
    }
  }
  return false;
}

MadeStream count_made_stream(std::string_view client, bool translated, std::string_view upstream,
                             std::string_view chunk) {
  MadeStream n;
  if (!translated) {
    http::SseReader reader;
    reader.push(client);
    while (auto ev = reader.next())
      if (ev->has_data) ++n.events;
  }
  // (A chunk that carries only a finish_reason is no token, as on the relay: respond_stream.)
  if (!chunk.empty()) {
    n.content = api::openai::classify_chunk(chunk) == api::openai::ChunkKind::content;
    n.tokens = n.content && api::openai::chunk_has_tokens(chunk) ? 1 : 0;
    if (translated) n.events = 2;
    return n;
  }
  http::SseReader up;
  up.push(upstream);
  while (auto ev = up.next()) {
    if (!ev->has_data) continue;
    if (translated) ++n.events;
    if (ev->is_done()) continue;
    if (!n.content) n.content = api::openai::classify_chunk(ev->data) == api::openai::ChunkKind::content;
    if (n.content && (!api::openai::may_be_finish_only(ev->data) || api::openai::chunk_has_tokens(ev->data)))
      ++n.tokens;
  }
  return n;
}

bool decoded_stream_translated(std::string_view sse, Translation client, const RequestContext& ctx, std::string& out,
                               std::string* unfinished) {
  http::SseReader reader;
  reader.push(sse);
  const auto run = [&](auto& tr) {
    while (auto ev = reader.next()) {
      if (!ev->has_data) continue;
      if (ev->is_done()) break;
      tr.on_data(ev->data, out);
    }
    tr.finish(out);
    if (unfinished) unfinished->assign(tr.unfinished());
    return !tr.failed();
  };
  if (client == Translation::anthropic) {
    api::anthropic::StreamTranslator tr;
    tr.reset(ctx.upstream_id(), static_cast<std::size_t>(ctx.gen->config().server.max_response_bytes),
             ctx.fields.thinking);
    return run(tr);
  }
  api::responses::StreamTranslator tr;
  tr.reset(ctx.responses_echo(), ctx.upstream_id(), ctx.model,
           static_cast<std::size_t>(ctx.gen->config().server.max_response_bytes));
  return run(tr);
}

}  // namespace weir::gateway
