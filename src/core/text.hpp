// ASCII text helpers shared by every module (header names, schemes, tokens).
#pragma once

#include <string_view>

namespace weir::core {

inline constexpr char ascii_lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

// ASCII case-insensitive equality (HTTP field names, RFC 9110 §5.1; auth schemes, §11.1).
constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  return true;
}

// `s` without leading and trailing spaces and tabs (RFC 9110 §5.6.3 OWS).
constexpr std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace weir::core
