#include "api/request.hpp"

#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "core/multipart.hpp"
#include "core/text.hpp"

namespace weir::api {

namespace json = boost::json;

namespace {

// Adds the UTF-8 bytes of every string inside a message "content" (a string
// or an array of parts {type:"text", text:"..."}).
std::uint64_t content_bytes(const json::value& v) {
  if (v.is_string()) return v.get_string().size();
  std::uint64_t n = 0;
  if (v.is_array())
    for (const auto& part : v.get_array())
      if (part.is_object())
        if (auto* t = part.get_object().if_contains("text"); t && t->is_string()) n += t->get_string().size();
  return n;
}

// UTF-8 bytes of every string in `v` (nested arrays and objects, 8 levels),
// and 4 per number (a token id): the prompt text of vLLM's pooling bodies.
std::uint64_t text_bytes(const json::value& v, int depth) {
  if (v.is_string()) return v.get_string().size();
  if (v.is_number()) return 4;
  std::uint64_t n = 0;
  if (depth >= 8) return n;
  if (v.is_array())
    for (const auto& e : v.get_array()) n += text_bytes(e, depth + 1);
  else if (v.is_object())
    for (const auto& kv : v.get_object()) n += text_bytes(kv.value(), depth + 1);
  return n;
}

tl::expected<std::uint32_t, core::Error> positive_int(const json::value& v, std::string_view name) {
  if (v.is_int64() && v.get_int64() >= 1 && v.get_int64() <= 0xffffffffLL)
    return static_cast<std::uint32_t>(v.get_int64());
  if (v.is_uint64() && v.get_uint64() >= 1 && v.get_uint64() <= 0xffffffffULL)
    return static_cast<std::uint32_t>(v.get_uint64());
  return tl::unexpected(core::bad_request(fmt::format("'{}' must be a positive integer.", name), name));
}

}  // namespace

tl::expected<RequestFields, core::Error> parse_request(ApiKind kind, std::string_view body) {
  // The DOM lives in a per-thread arena: parsing allocates nothing for bodies
  // whose DOM fits in it, and it is released before this function returns.
  alignas(16) static thread_local unsigned char arena[64 * 1024];
  json::monotonic_resource mr(arena, sizeof arena);
  json::parse_options opt;
  opt.max_depth = 64;
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(body.data(), body.size()), ec, &mr, opt);
  if (ec) {
    if (body.empty()) return tl::unexpected(core::bad_request("The request body is empty; expected a JSON object."));
    return tl::unexpected(core::bad_request(fmt::format("The request body is not valid JSON: {}.", ec.message())));
  }
  if (!doc.is_object()) return tl::unexpected(core::bad_request("The request body must be a JSON object."));
  const auto& obj = doc.get_object();

  RequestFields f;
  const auto* model = obj.if_contains("model");
  if ((!model || model->is_null()) && kind == ApiKind::vllm_extra) {
    // vLLM takes these without a model (its served model); the gateway routes them to the default pool.
  } else if (!model || model->is_null()) {
    return tl::unexpected(core::bad_request("you must provide a model parameter", "model"));
  } else {
    if (!model->is_string() || model->get_string().empty())
      return tl::unexpected(core::bad_request("'model' must be a non-empty string.", "model"));
    f.model.assign(model->get_string().data(), model->get_string().size());
  }

  if (const auto* s = obj.if_contains("stream"); s && !s->is_null()) {
    if (!s->is_bool()) return tl::unexpected(core::bad_request("'stream' must be a boolean.", "stream"));
    f.stream = s->get_bool();
  }
  if (const auto* so = obj.if_contains("stream_options"); so && !so->is_null()) {
    if (!so->is_object())
      return tl::unexpected(core::bad_request("'stream_options' must be an object.", "stream_options"));
    f.has_stream_options = true;
    if (const auto* iu = so->get_object().if_contains("include_usage"); iu && iu->is_bool())
      f.include_usage = iu->get_bool();
  }
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (const auto* m = obj.if_contains(name); m && !m->is_null() && f.max_tokens == 0) {
      auto v = positive_int(*m, name);
      if (!v) return tl::unexpected(v.error());
      f.max_tokens = *v;
    }
  }
  if (const auto* n = obj.if_contains("n"); n && !n->is_null()) {
    auto v = positive_int(*n, "n");
    if (!v) return tl::unexpected(v.error());
    f.n = *v;
  }

  switch (kind) {
    case ApiKind::chat_completions:
      if (const auto* msgs = obj.if_contains("messages"); msgs && msgs->is_array())
        for (const auto& m : msgs->get_array()) {
          f.prompt_overhead_tokens += RequestFields::kChatTokensPerMessage;
          if (m.is_object())
            if (const auto* c = m.get_object().if_contains("content")) f.prompt_bytes += content_bytes(*c);
        }
      break;
    case ApiKind::vllm_extra:
      for (const char* name : {"prompt", "messages", "input", "text", "query", "documents", "text_1", "text_2"})
        if (const auto* v = obj.if_contains(name)) f.prompt_bytes += text_bytes(*v, 0);
      f.n = 1;
      f.stream = false;  // these routes never stream: nothing is added to their body
      break;
    case ApiKind::completions:
    case ApiKind::embeddings: {
      const auto* p = obj.if_contains(kind == ApiKind::completions ? "prompt" : "input");
      if (!p) break;
      if (p->is_string()) {
        f.prompt_bytes = p->get_string().size();
      } else if (p->is_array()) {
        const auto& a = p->get_array();
        const bool batch = !a.empty() && (a[0].is_string() || a[0].is_array());
        f.prompt_count = batch ? static_cast<std::uint32_t>(a.size()) : 1;
        for (const auto& e : a) {
          if (e.is_string())
            f.prompt_bytes += e.get_string().size();
          else if (e.is_array())
            f.prompt_bytes += 4 * e.get_array().size();  // token ids
          else
            f.prompt_bytes += 4;  // one token id
        }
      }
      f.prompt_overhead_tokens = f.prompt_count;  // BOS (add_special_tokens defaults to true)
      if (kind == ApiKind::embeddings) f.n = 1;
      break;
    }
    case ApiKind::audio:  // not JSON: parse_audio_request
      break;
  }
  return f;
}

bool numbers_finite(const json::value& v) {
  // Iterative: a DOM is at most parse_options::max_depth deep, but no recursion is needed.
  std::vector<const json::value*> pending{&v};
  while (!pending.empty()) {
    const json::value* x = pending.back();
    pending.pop_back();
    if (x->is_double()) {
      if (!std::isfinite(x->get_double())) return false;
    } else if (x->is_array()) {
      for (const auto& e : x->get_array()) pending.push_back(&e);
    } else if (x->is_object()) {
      for (const auto& kv : x->get_object()) pending.push_back(&kv.value());
    }
  }
  return true;
}

std::optional<bool> form_bool(std::string_view v) {
  for (std::string_view t : {"true", "1", "yes", "on", "t", "y"})
    if (core::iequals(v, t)) return true;
  for (std::string_view f : {"false", "0", "no", "off", "f", "n"})
    if (core::iequals(v, f)) return false;
  return std::nullopt;
}

tl::expected<RequestFields, core::Error> parse_audio_request(std::string_view content_type, std::string_view body) {
  auto boundary = core::form_boundary(content_type);
  if (!boundary) return tl::unexpected(core::bad_request(std::move(boundary.error())));
  auto parts = core::parse_form(body, *boundary);
  if (!parts) return tl::unexpected(core::bad_request(std::move(parts.error())));
  // The upstream's form parser (Starlette) keeps the last of repeated
  // fields, Weir reads the first: a repeated field Weir acts on would route
  // and authorize one model and run another, so it is refused.
  for (std::string_view name : {"model", "stream", "stream_include_usage"}) {
    int n = 0;
    for (const auto& p : *parts) n += p.name == name;
    if (n > 1)
      return tl::unexpected(core::bad_request(fmt::format("'{}' is given more than once in the form.", name), name));
  }
  RequestFields f;
  const auto* file = core::find_part(*parts, "file");
  if (!file || !file->has_filename)
    return tl::unexpected(core::bad_request("you must provide the audio as a 'file' part with a filename", "file"));
  if (const auto* m = core::find_part(*parts, "model")) {
    if (m->value.empty()) return tl::unexpected(core::bad_request("'model' must be a non-empty string.", "model"));
    f.model.assign(m->value);
  }
  for (const auto& [name, out] :
       {std::pair{"stream", &f.stream}, std::pair{"stream_include_usage", &f.include_usage}}) {
    const auto* p = core::find_part(*parts, name);
    if (!p) continue;
    const auto b = form_bool(p->value);
    if (!b) return tl::unexpected(core::bad_request(fmt::format("'{}' must be a boolean.", name), name));
    *out = *b;
  }
  f.has_stream_options = f.include_usage;
  if (const auto* p = core::find_part(*parts, "prompt")) f.prompt_bytes = p->value.size();
  return f;
}

}  // namespace weir::api
