#include "api/tool_ids.hpp"

#include <algorithm>
#include <cstdint>

namespace weir::api {

namespace {

bool id_byte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

}  // namespace

bool is_anthropic_tool_id(std::string_view id) { return !id.empty() && std::all_of(id.begin(), id.end(), id_byte); }

void to_anthropic_tool_id(std::string& id) {
  if (is_anthropic_tool_id(id)) return;
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bits: the same on every build and platform
  for (const char c : id) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  for (char& c : id)
    if (!id_byte(c)) c = '_';
  static constexpr char kHex[] = "0123456789abcdef";
  char suffix[17];
  suffix[0] = '-';
  for (int i = 0; i < 16; ++i) suffix[1 + i] = kHex[(h >> (60 - 4 * i)) & 0xf];
  id.append(suffix, sizeof suffix);
}

}  // namespace weir::api
