// Speech-to-text form bodies (multipart/form-data) read for routing and admission: api/request.hpp's
// parse_audio_request.
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "api/request.hpp"
#include "core/multipart.hpp"

namespace weir::api {

tl::expected<RequestFields, core::Error> parse_audio_request(std::string_view content_type, std::string_view body) {
  auto boundary = core::form_boundary(content_type);
  if (!boundary) return tl::unexpected(core::bad_request(std::move(boundary.error())));
  auto parts = core::parse_form(body, *boundary);
  if (!parts) return tl::unexpected(core::bad_request(std::move(parts.error())));
  // The upstream's form parser (Starlette) keeps the last of repeated
  // fields, Weir reads the first: a repeated field Weir acts on would route
  // and authorize one model and run another, so it is refused.
  // (`prompt` too: its bytes are the token estimate the limits admit.)
  for (std::string_view name : {"model", "stream", "stream_include_usage", "stream_continuous_usage_stats", "prompt"}) {
    int n = 0;
    for (const auto& p : *parts) n += p.name == name;
    if (n > 1)
      return tl::unexpected(core::bad_request(fmt::format("'{}' is given more than once in the form.", name), name));
  }
  RequestFields f;
  const auto* file = core::find_part(*parts, "file");
  if (!file || !file->has_filename)
    return tl::unexpected(core::bad_request("you must provide the audio as a 'file' part with a filename", "file"));
  // An empty model field is vLLM's served model, as in a JSON body: the default pool's.
  if (const auto* m = core::find_part(*parts, "model")) {
    // A file part named model: Starlette hands vLLM an upload, not the name Weir would route by.
    if (m->has_filename)
      return tl::unexpected(core::bad_request("'model' must be a text field of the form, not a file.", "model"));
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
  f.usage_asked = f.include_usage;  // (vLLM's form field defaults to false)
  if (const auto* p = core::find_part(*parts, "prompt")) f.prompt_bytes = p->value.size();
  return f;
}

}  // namespace weir::api
