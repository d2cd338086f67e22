// A message head's fields in one flat buffer: the Fields type of Weir's
// request and response heads (Beast's Fields concept, so
// boost::beast::http::header<isRequest, FlatFields> gives method(),
// target(), result(), keep_alive() as for Beast's own heads).
//
// Why not Beast's basic_fields: it makes each field an element of its own
// (an allocation, a copy, an insert into a case-insensitive red-black
// tree; ~310 instructions per field to insert, ~145 to destroy), where
// a head is written once by the parser, read in order a few times, and
// dropped. Here a field is a record appended to one buffer (an 8-byte
// header, the name, the value), lookups scan in order comparing Beast's
// field codes (a head carries about a dozen fields), and the buffer's
// capacity can be handed to the next head (take_storage / adopt_storage),
// so a kept-alive connection's heads allocate nothing.
//
// Differences from basic_fields, none of which Weir's code relies on:
// iteration is in insertion order (as basic_fields' is) and lookups find a
// name's first field in that order; equal_range is not offered (scan with
// begin()/end()); erase and set are linear (they rebuild the buffer; only
// code that builds heads by hand calls them); no serializer (Weir writes
// its heads itself: http/forward.hpp, http/response_head.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string_view>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/optional/optional.hpp>

namespace weir::http {

class FlatFields {
 public:
  using field = boost::beast::http::field;

  // One field line: Beast's code for its name (field::unknown for a name
  // Beast has no code for), the name as it came, and the value (as Beast's
  // parser gives it: leading and trailing whitespace removed).
  class value_type {
   public:
    value_type(field code, std::string_view name, std::string_view value) noexcept
        : code_(code), name_(name), value_(value) {}
    field name() const noexcept { return code_; }
    std::string_view name_string() const noexcept { return name_; }
    std::string_view value() const noexcept { return value_; }

   private:
    field code_;
    std::string_view name_;
    std::string_view value_;
  };

  // Walks the records in order; dereferences to a value_type by value.
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = FlatFields::value_type;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = FlatFields::value_type;

    const_iterator() = default;
    value_type operator*() const noexcept {
      const Record r = load(p_);
      const char* name = p_ + sizeof(Record);
      return {static_cast<field>(r.code), {name, r.name_len}, {name + r.name_len, r.value_len}};
    }
    // `it->value()` as on Beast's iterators.
    struct Arrow {
      value_type v;
      const value_type* operator->() const noexcept { return &v; }
    };
    Arrow operator->() const noexcept { return {**this}; }
    const_iterator& operator++() noexcept {
      const Record r = load(p_);
      p_ += sizeof(Record) + r.name_len + r.value_len;
      return *this;
    }
    const_iterator operator++(int) noexcept {
      auto old = *this;
      ++*this;
      return old;
    }
    bool operator==(const const_iterator& o) const noexcept { return p_ == o.p_; }

   private:
    friend class FlatFields;
    explicit const_iterator(const char* p) noexcept : p_(p) {}
    const char* p_ = nullptr;
  };
  using iterator = const_iterator;

  // A head's buffer, handed from one head to the next (take_storage, adopt_storage).
  struct Storage {
    std::unique_ptr<char[]> bytes;
    std::uint32_t capacity = 0;
  };

  FlatFields() = default;
  FlatFields(const FlatFields& o);
  FlatFields(FlatFields&& o) noexcept
      : data_(std::move(o.data_)), size_(o.size_), cap_(o.cap_), line_len_(o.line_len_), method_len_(o.method_len_) {
    o.size_ = o.cap_ = o.line_len_ = o.method_len_ = 0;
  }
  FlatFields& operator=(const FlatFields& o) {
    if (this != &o) *this = FlatFields(o);
    return *this;
  }
  FlatFields& operator=(FlatFields&& o) noexcept {
    if (this != &o) {
      data_ = std::move(o.data_);
      size_ = o.size_, cap_ = o.cap_, line_len_ = o.line_len_, method_len_ = o.method_len_;
      o.size_ = o.cap_ = o.line_len_ = o.method_len_ = 0;
    }
    return *this;
  }
  ~FlatFields() = default;

  const_iterator begin() const noexcept { return const_iterator(data_.get() + line_len_); }
  const_iterator end() const noexcept { return const_iterator(data_.get() + size_); }
  const_iterator cbegin() const noexcept { return begin(); }
  const_iterator cend() const noexcept { return end(); }
  bool empty() const noexcept { return size_ == line_len_; }

  // The first field with the code `name` (not field::unknown) or the name
  // `name` (ASCII case-insensitive), or end().
  const_iterator find(field name) const noexcept;
  const_iterator find(std::string_view name) const noexcept;
  // Its value, or "" (as basic_fields' operator[]).
  std::string_view operator[](field name) const noexcept;
  std::string_view operator[](std::string_view name) const noexcept;
  // How many fields have this code or name.
  std::size_t count(field name) const noexcept;
  std::size_t count(std::string_view name) const noexcept;

  // Appends a field: its code with Beast's spelling of the name, a name
  // (its code looked up), or both as the parser read them (`name_string`
  // as it came). Throws std::length_error for a name over 65,535 bytes or
  // a value over 4 GiB (as basic_fields does for names), std::bad_alloc.
  void insert(field name, std::string_view value);
  void insert(std::string_view name, std::string_view value);
  void insert(field name, std::string_view name_string, std::string_view value);
  // Replaces every field of that name with one (appended last).
  void set(field name, std::string_view value);
  void set(std::string_view name, std::string_view value);
  // Removes every field of that name; returns how many.
  std::size_t erase(field name);
  std::size_t erase(std::string_view name);
  // Removes every field; the request line's method and target (or the
  // status line's reason) stay. Frees the buffer beyond them (a stream's
  // head after it was forwarded: Exchange::shrink).
  void clear() noexcept;

  // The buffer (its capacity) for another head: this one is left empty
  // (no fields, no method, target or reason).
  Storage take_storage() noexcept;
  // Reuses `s`'s buffer for this head, when it has none of its own yet and
  // `s` is at most kKeepBytes (a head far larger than usual, up to
  // server.max_header, is not held by an idle connection): else frees it.
  static constexpr std::uint32_t kKeepBytes = 4096;
  void adopt_storage(Storage s) noexcept;
  // Bytes the head's buffer holds (its capacity).
  std::uint32_t storage_bytes() const noexcept { return cap_; }

  // Beast's Fields concept (boost/beast/http/fields.hpp).
  boost::beast::string_view get_method_impl() const noexcept { return {data_.get(), method_len_}; }
  boost::beast::string_view get_target_impl() const noexcept {
    return {data_.get() + method_len_, line_len_ - method_len_};
  }
  boost::beast::string_view get_reason_impl() const noexcept { return {data_.get(), line_len_}; }
  bool get_chunked_impl() const noexcept;
  bool get_keep_alive_impl(unsigned version) const noexcept;
  bool has_content_length_impl() const noexcept { return find(field::content_length) != end(); }
  void set_method_impl(boost::beast::string_view s) { set_line(s, get_target_impl()); }
  void set_target_impl(boost::beast::string_view s) { set_line(get_method_impl(), s); }
  void set_reason_impl(boost::beast::string_view s) { set_line({}, s); }
  void set_chunked_impl(bool value);
  void set_content_length_impl(const boost::optional<std::uint64_t>& value);
  void set_keep_alive_impl(unsigned version, bool keep_alive);

 private:
  // A field's record before its name and value bytes (unaligned: memcpy).
  struct Record {
    std::uint16_t code;
    std::uint16_t name_len;
    std::uint32_t value_len;
  };
  static_assert(sizeof(Record) == 8);
  static Record load(const char* p) noexcept {
    Record r;
    std::memcpy(&r, p, sizeof r);
    return r;
  }
  // Replaces the line part (method + target, or the reason) before the records.
  void set_line(std::string_view method, std::string_view rest);
  // Keeps the records for which `drop` is false; returns how many went.
  template <class Drop>
  std::size_t erase_if(Drop drop);

  // Makes room for `need` bytes in all (the bytes kept).
  void reserve(std::size_t need);
  // Whether `v` lies in this head's buffer (a field or line copied within the head).
  bool inside(std::string_view v) const noexcept {
    const char* d = data_.get();
    return !v.empty() && d != nullptr && v.data() >= d && v.data() < d + size_;
  }

  std::unique_ptr<char[]> data_;  // [method][target] or [reason], then the records
  std::uint32_t size_ = 0;        // bytes used
  std::uint32_t cap_ = 0;         // bytes allocated
  std::uint32_t line_len_ = 0;    // bytes of the line part
  std::uint32_t method_len_ = 0;  // bytes of it that are the method (a verb Beast has no code for)
};

}  // namespace weir::http
