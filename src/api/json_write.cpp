// Compact JSON text of a Boost.JSON DOM with Python-style doubles (json_write.hpp).
#include "api/json_write.hpp"

#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

#include <boost/json/value.hpp>

namespace weir::api {
namespace {

// Boost.JSON's escapes (boost/json/impl/serializer.ipp): 0 for a byte written as it is.
constexpr char escape_of(unsigned char c) {
  switch (c) {
    case '"':
      return '"';
    case '\\':
      return '\\';
    case '\b':
      return 'b';
    case '\t':
      return 't';
    case '\n':
      return 'n';
    case '\f':
      return 'f';
    case '\r':
      return 'r';
    default:
      return c < 0x20 ? 'u' : 0;
  }
}

void append_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const char e = escape_of(c);
    if (e == 0) continue;
    out.append(s.substr(run, i - run));
    run = i + 1;
    out += '\\';
    if (e != 'u') {
      out += e;
      continue;
    }
    out += "u00";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  out.append(s.substr(run));
  out += '"';
}

void append_double(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "null";
    return;
  }
  if (std::isinf(d)) {
    out += d < 0 ? "-1e999" : "1e999";
    return;
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  const std::string_view text(buf, static_cast<std::size_t>(r.ptr - buf));
  out += text;
  if (text.find_first_of(".e") == std::string_view::npos) out += ".0";
}

void append_scalar(std::string& out, const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null:
      out += "null";
      return;
    case boost::json::kind::bool_:
      out += v.get_bool() ? "true" : "false";
      return;
    case boost::json::kind::int64: {
      char buf[24];
      out.append(buf, static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v.get_int64()).ptr - buf));
      return;
    }
    case boost::json::kind::uint64: {
      char buf[24];
      out.append(buf, static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v.get_uint64()).ptr - buf));
      return;
    }
    case boost::json::kind::double_:
      append_double(out, v.get_double());
      return;
    case boost::json::kind::string:
      append_string(out, {v.get_string().data(), v.get_string().size()});
      return;
    case boost::json::kind::array:
    case boost::json::kind::object:
      return;  // (containers: append_json's loop)
  }
}

// One open container: its next element or member.
struct Frame {
  const boost::json::value* container;
  std::size_t next = 0;
};

}  // namespace

void append_json(std::string& out, const boost::json::value& root) {
  if (!root.is_array() && !root.is_object()) {
    append_scalar(out, root);
    return;
  }
  std::vector<Frame> stack;
  out += root.is_array() ? '[' : '{';
  stack.push_back({&root});
  while (!stack.empty()) {
    Frame& f = stack.back();
    const boost::json::value* child = nullptr;
    if (f.container->is_array()) {
      const auto& a = f.container->get_array();
      if (f.next == a.size()) {
        out += ']';
        stack.pop_back();
        continue;
      }
      if (f.next > 0) out += ',';
      child = &a[f.next++];
    } else {
      const auto& o = f.container->get_object();
      if (f.next == o.size()) {
        out += '}';
        stack.pop_back();
        continue;
      }
      if (f.next > 0) out += ',';
      const auto& kv = *(o.begin() + static_cast<std::ptrdiff_t>(f.next++));
      append_string(out, {kv.key().data(), kv.key().size()});
      out += ':';
      child = &kv.value();
    }
    if (child->is_array() || child->is_object()) {
      out += child->is_array() ? '[' : '{';
      stack.push_back({child});  // (f is not used after this: the push may move it)
    } else {
      append_scalar(out, *child);
    }
  }
}

std::string to_json(const boost::json::value& v) {
  std::string out;
  append_json(out, v);
  return out;
}

}  // namespace weir::api
