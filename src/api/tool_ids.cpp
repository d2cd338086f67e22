#include "api/tool_ids.hpp"

#include <algorithm>
#include <cstdint>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

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

bool map_tool_ids(std::string_view body, std::string& out) {
  // ("tool_use" is in every tool_use block's type and every tool_result's tool_use_id.)
  if (body.find("tool_use") == std::string_view::npos) return false;
  // A walk over the text's structure: the containers open around the cursor (a content block is the object at
  // depth 5 of {"messages": [{"content": [{...}]}]}), and each member's key as its raw text.
  enum class Key : std::uint8_t { other, messages, content, id };
  struct Frame {
    bool object;
    Key key;  // the member of the parent object this container is the value of
  };
  constexpr std::size_t kDepth = 66;  // > the parse's max_depth (64)
  Frame frames[kDepth];
  std::size_t depth = 0;
  bool expect_key = false;  // in an object, before a member's name
  Key key = Key::other;     // the member whose value comes next (in an object)
  bool changed = false;
  std::size_t copied = 0;  // body[0, copied) is in `out` (once changed)
  std::string id;
  const auto block = [&] {
    return depth == 5 && frames[0].object && !frames[1].object && frames[1].key == Key::messages && frames[2].object &&
           !frames[3].object && frames[3].key == Key::content && frames[4].object;
  };
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '"') {
      std::size_t j = i + 1;
      bool escaped = false;
      while (j < body.size() && body[j] != '"') {
        if (body[j] == '\\') {
          escaped = true;
          ++j;
        }
        ++j;
      }
      if (j >= body.size()) return false;  // (not valid JSON: left as it is)
      const std::string_view raw = body.substr(i + 1, j - i - 1);
      if (depth > 0 && frames[depth - 1].object && expect_key) {
        key = raw == "messages"                     ? Key::messages
              : raw == "content"                    ? Key::content
              : raw == "id" || raw == "tool_use_id" ? Key::id
                                                    : Key::other;
        expect_key = false;
      } else if (key == Key::id && block()) {
        id.assign(raw);
        if (escaped) {
          boost::system::error_code ec;
          const boost::json::value v = boost::json::parse(boost::json::string_view(body.data() + i, j + 1 - i), ec);
          if (ec || !v.is_string()) return false;
          id.assign(v.get_string().data(), v.get_string().size());
        }
        if (!id.empty() && !is_anthropic_tool_id(id)) {
          to_anthropic_tool_id(id);
          if (!changed) out.clear();
          changed = true;
          out.append(body.substr(copied, i + 1 - copied));
          out += id;  // (the mapped id has only [a-zA-Z0-9_-]: nothing to escape)
          copied = j;
        }
      }
      i = j;
      continue;
    }
    switch (c) {
      case '{':
      case '[':
        if (depth == kDepth) return false;
        frames[depth] = Frame{c == '{', depth > 0 && frames[depth - 1].object ? key : Key::other};
        ++depth;
        expect_key = c == '{';
        key = Key::other;
        break;
      case '}':
      case ']':
        if (depth > 0) --depth;
        key = Key::other;
        break;
      case ',':
        expect_key = depth > 0 && frames[depth - 1].object;
        key = Key::other;
        break;
      default:
        break;
    }
  }
  if (changed) out.append(body.substr(copied));
  return changed;
}

}  // namespace weir::api
