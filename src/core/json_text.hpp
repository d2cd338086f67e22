// Writing JSON text by hand on hot paths (access log lines, error bodies,
// response heads) without building a DOM.
#pragma once

#include <string>
#include <string_view>

namespace weir::core {

// Appends `s` as a JSON string literal (RFC 8259 §7 escaping) to `out`.
// Bytes ≥ 0x80 are copied as they are (the input is expected to be UTF-8).
void append_json_string(std::string& out, std::string_view s);

}  // namespace weir::core
