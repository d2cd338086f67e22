#include "http/flat_fields.hpp"

#include <algorithm>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include <boost/beast/http/rfc7230.hpp>

#include "core/text.hpp"

namespace weir::http {

namespace {

namespace bh = boost::beast::http;

// The first head's room: a request from the OpenAI SDK (about a dozen
// fields) or a vLLM response head fits, so a head grows at most once.
constexpr std::size_t kFirstRoom = 512;

// The last token of a comma-separated list (a Transfer-Encoding's final coding).
std::string_view last_token(std::string_view list) noexcept {
  std::string_view last;
  for (auto t : bh::token_list{list}) last = {t.data(), t.size()};
  return last;
}

}  // namespace

FlatFields::const_iterator FlatFields::find(field name) const noexcept {
  const auto e = end();
  for (auto it = begin(); it != e; ++it)
    if (load(it.p_).code == static_cast<std::uint16_t>(name)) return it;
  return e;
}

FlatFields::const_iterator FlatFields::find(std::string_view name) const noexcept {
  const auto e = end();
  for (auto it = begin(); it != e; ++it)
    if (core::iequals((*it).name_string(), name)) return it;
  return e;
}

std::string_view FlatFields::operator[](field name) const noexcept {
  const auto it = find(name);
  return it == end() ? std::string_view() : (*it).value();
}

std::string_view FlatFields::operator[](std::string_view name) const noexcept {
  const auto it = find(name);
  return it == end() ? std::string_view() : (*it).value();
}

std::size_t FlatFields::count(field name) const noexcept {
  std::size_t n = 0;
  for (auto it = begin(), e = end(); it != e; ++it) n += load(it.p_).code == static_cast<std::uint16_t>(name);
  return n;
}

std::size_t FlatFields::count(std::string_view name) const noexcept {
  std::size_t n = 0;
  for (const auto& f : *this) n += core::iequals(f.name_string(), name);
  return n;
}

void FlatFields::insert(field name, std::string_view value) {
  const auto s = bh::to_string(name);
  insert(name, std::string_view(s.data(), s.size()), value);
}

void FlatFields::insert(std::string_view name, std::string_view value) {
  insert(bh::string_to_field(name), name, value);
}

void FlatFields::insert(field name, std::string_view name_string, std::string_view value) {
  if (name_string.size() > std::numeric_limits<std::uint16_t>::max()) throw std::length_error("field name too large");
  const std::size_t need = std::size_t{size_} + sizeof(Record) + name_string.size() + value.size();
  if (need > std::numeric_limits<std::uint32_t>::max()) throw std::length_error("fields too large");
  if (need > cap_) {
    if (inside(name_string) || inside(value)) {
      // Bytes of this buffer (a field copied from another): they move with the growth.
      const std::string n(name_string), v(value);
      insert(name, n, v);
      return;
    }
    reserve(need);
  }
  const Record r{static_cast<std::uint16_t>(name), static_cast<std::uint16_t>(name_string.size()),
                 static_cast<std::uint32_t>(value.size())};
  char* p = data_.get() + size_;
  std::memcpy(p, &r, sizeof r);
  if (!name_string.empty()) std::memcpy(p + sizeof r, name_string.data(), name_string.size());
  if (!value.empty()) std::memcpy(p + sizeof r + name_string.size(), value.data(), value.size());
  size_ = static_cast<std::uint32_t>(need);
}

void FlatFields::reserve(std::size_t need) {
  if (need <= cap_) return;
  const std::size_t cap = std::min<std::size_t>(std::max(need, std::max(kFirstRoom, 2 * std::size_t{cap_})),
                                                std::numeric_limits<std::uint32_t>::max());
  auto bytes = std::make_unique_for_overwrite<char[]>(cap);
  if (size_ > 0) std::memcpy(bytes.get(), data_.get(), size_);
  data_ = std::move(bytes);
  cap_ = static_cast<std::uint32_t>(cap);
}

FlatFields::FlatFields(const FlatFields& o)
    : size_(o.size_), cap_(o.size_), line_len_(o.line_len_), method_len_(o.method_len_) {
  if (size_ == 0) return;
  data_ = std::make_unique_for_overwrite<char[]>(size_);
  std::memcpy(data_.get(), o.data_.get(), size_);
}

template <class Drop>
std::size_t FlatFields::erase_if(Drop drop) {
  std::size_t gone = 0;
  std::size_t to = line_len_;
  char* d = data_.get();
  for (std::size_t from = line_len_; from < size_;) {
    const Record r = load(d + from);
    const std::size_t len = sizeof r + r.name_len + r.value_len;
    if (drop(static_cast<field>(r.code), std::string_view(d + from + sizeof r, r.name_len))) {
      ++gone;
    } else {
      if (to != from) std::memmove(d + to, d + from, len);
      to += len;
    }
    from += len;
  }
  size_ = static_cast<std::uint32_t>(to);
  return gone;
}

std::size_t FlatFields::erase(field name) {
  return erase_if([name](field code, std::string_view) { return code == name; });
}

std::size_t FlatFields::erase(std::string_view name) {
  return erase_if([name](field, std::string_view n) { return core::iequals(n, name); });
}

void FlatFields::set(field name, std::string_view value) {
  if (inside(value)) {  // erase() would move the bytes first
    const std::string v(value);
    set(name, v);
    return;
  }
  erase(name);
  insert(name, value);
}

void FlatFields::set(std::string_view name, std::string_view value) {
  if (inside(name) || inside(value)) {
    const std::string n(name), v(value);
    set(n, v);
    return;
  }
  erase(name);
  insert(name, value);
}

void FlatFields::clear() noexcept {
  size_ = line_len_;
  if (cap_ == size_) return;
  // Keep only the line (a response's reason), in a buffer of its size.
  std::unique_ptr<char[]> line;
  if (line_len_ > 0) {
    line.reset(new (std::nothrow) char[line_len_]);
    if (!line) return;  // keep the old buffer
    std::memcpy(line.get(), data_.get(), line_len_);
  }
  data_ = std::move(line);
  cap_ = size_;
}

FlatFields::Storage FlatFields::take_storage() noexcept {
  Storage s{std::move(data_), cap_};
  size_ = cap_ = line_len_ = method_len_ = 0;
  return s;
}

void FlatFields::adopt_storage(Storage s) noexcept {
  if (data_ || !s.bytes || s.capacity > kKeepBytes) return;
  data_ = std::move(s.bytes);
  cap_ = s.capacity;
  size_ = line_len_ = method_len_ = 0;
}

void FlatFields::set_line(std::string_view method, std::string_view rest) {
  const char* d = data_.get();
  if (method.size() == method_len_ && (method.empty() || method.data() == d) &&
      rest.size() == line_len_ - method_len_ && rest.data() == d + method_len_)
    return;  // unchanged (header<true>::method(verb) clears a method that is already clear)
  if (inside(method) || inside(rest)) {
    // Made of this buffer's bytes: copied out first (only heads built by hand).
    const std::string m(method), r(rest);
    set_line(m, r);
    return;
  }
  const std::size_t line = method.size() + rest.size();
  const std::size_t need = std::size_t{size_} - line_len_ + line;
  if (need > std::numeric_limits<std::uint32_t>::max()) throw std::length_error("request line too large");
  reserve(need);
  char* p = data_.get();
  if (line != line_len_ && size_ > line_len_) std::memmove(p + line, p + line_len_, size_ - line_len_);
  if (!method.empty()) std::memcpy(p, method.data(), method.size());
  if (!rest.empty()) std::memcpy(p + method.size(), rest.data(), rest.size());
  size_ = static_cast<std::uint32_t>(need);
  line_len_ = static_cast<std::uint32_t>(line);
  method_len_ = static_cast<std::uint32_t>(method.size());
}

bool FlatFields::get_chunked_impl() const noexcept {
  return core::iequals(last_token((*this)[field::transfer_encoding]), "chunked");
}

bool FlatFields::get_keep_alive_impl(unsigned version) const noexcept {
  const auto it = find(field::connection);
  if (version < 11) return it != end() && bh::token_list{(*it).value()}.exists("keep-alive");
  return it == end() || !bh::token_list{(*it).value()}.exists("close");
}

void FlatFields::set_chunked_impl(bool value) {
  const std::string te((*this)[field::transfer_encoding]);
  const bool chunked = core::iequals(last_token(te), "chunked");
  if (value == chunked) return;
  if (value) {
    set(field::transfer_encoding, te.empty() ? std::string("chunked") : te + ", chunked");
    return;
  }
  // Drop the final "chunked" and keep the codings before it.
  std::string rest;
  for (auto t : bh::token_list{te}) {
    if (!rest.empty()) rest += ", ";
    rest.append(t.data(), t.size());
  }
  const auto cut = rest.rfind(", ");
  rest.resize(cut == std::string::npos ? 0 : cut);
  if (rest.empty())
    erase(field::transfer_encoding);
  else
    set(field::transfer_encoding, rest);
}

void FlatFields::set_content_length_impl(const boost::optional<std::uint64_t>& value) {
  if (!value)
    erase(field::content_length);
  else
    set(field::content_length, std::to_string(*value));
}

void FlatFields::set_keep_alive_impl(unsigned version, bool keep_alive) {
  // Only the keep-alive or close token Beast would write: other tokens of
  // the Connection field (RFC 9110 §7.6.1) stay.
  const std::string old((*this)[field::connection]);
  std::string v;
  for (auto t : bh::token_list{old}) {
    const std::string_view tok(t.data(), t.size());
    if (core::iequals(tok, "keep-alive") || core::iequals(tok, "close")) continue;
    if (!v.empty()) v += ", ";
    v += tok;
  }
  const char* add = version < 11 ? (keep_alive ? "keep-alive" : nullptr) : (keep_alive ? nullptr : "close");
  if (add) {
    if (!v.empty()) v += ", ";
    v += add;
  }
  if (v.empty())
    erase(field::connection);
  else
    set(field::connection, v);
}

}  // namespace weir::http
