// multipart/form-data bodies (RFC 7578, on RFC 2046 §5.1's multipart
// syntax), read in place: what the audio routes need to find a request's
// `model` and `stream` fields and to rename the model for the upstream,
// without copying the file part.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

namespace weir::core {

// One part of a form. The views point into the body that was parsed.
struct FormPart {
  // Content-Disposition's name parameter (may be empty), unquoted as the
  // upstream's parser (python-multipart) reads it.
  std::string name;
  std::string filename;           // its filename parameter, so unquoted, when has_filename
  bool has_filename = false;      // a file part (filename= given, even empty)
  std::string_view content_type;  // the part's Content-Type, empty when absent
  std::string_view value;         // the part's content, between its head and the next delimiter
};

// The boundary of a `Content-Type: multipart/form-data; boundary=...` value
// (media type and parameter names case-insensitive; the boundary quoted or
// not, 1..70 characters, RFC 2046 §5.1.1). Errors (a sentence for a 400):
// another media type, no boundary, two boundary parameters, an empty or
// too long one, more than 32 parameters.
tl::expected<std::string_view, std::string> form_boundary(std::string_view content_type);

// The parts of `body`, in order. The body is: any CR and LF bytes (no other
// preamble: vLLM's python-multipart reads none), then "--boundary" parts
// each preceded by a CRLF-delimited delimiter line, and the close delimiter
// "--boundary--"; each part is header lines ending in CRLF, an empty line,
// then its content (RFC 2046 §5.1.1). Linear in the body's length. Errors (a
// sentence for a 400): no first delimiter, a preamble, a header with more
// than 32 parameters, a part
// without a head or without a Content-Disposition of form-data, a part
// with two Content-Disposition headers or two name parameters or an RFC
// 2231 name* (RFC 7578 §4.2 forbids it; the upstream would decode it and
// see a field Weir did not), no close delimiter, more than `max_parts`
// parts. filename* counts as a filename (kept undecoded).
tl::expected<std::vector<FormPart>, std::string> parse_form(std::string_view body, std::string_view boundary,
                                                            std::size_t max_parts = 256);

// The first part named `name`, or nullptr.
const FormPart* find_part(const std::vector<FormPart>& parts, std::string_view name);

// `body` with the content of `part` (a part parsed from `body`) replaced by
// `value`, written to `out` (cleared first). The value must not contain the
// delimiter; a model name (no CR or LF) never does.
void replace_part_value(std::string_view body, const FormPart& part, std::string_view value, std::string& out);

// `body` with one more text field `name=value` right after `last`, the
// last part parsed from it (so before the close delimiter, whatever the
// epilogue holds), written to `out` (cleared first). `name` and `value`
// must hold no CR, LF or '"'.
void append_form_field(std::string_view body, std::string_view boundary, const FormPart& last, std::string_view name,
                       std::string_view value, std::string& out);

}  // namespace weir::core
