// Beast's HTTP/1.1 parser (boost::beast::http::basic_parser: the whole of
// RFC 9112's syntax, limits, chunked framing) filling a message whose head
// is a FlatFields (http/flat_fields.hpp) rather than Beast's basic_fields.
// The same interface as boost::beast::http::parser<isRequest, Body> for what
// Weir uses of it (get(), release(), on_chunk_header(), and everything of
// basic_parser), with one difference: a chunked body's trailer fields are
// dropped, never merged into the head (RFC 9110 §6.5.1: a recipient must
// not merge a trailer field into the header section unless the field's
// definition allows it; Weir knows no such field). A body goes to `Body`'s
// reader as in Beast's parser (string_body for a client's request,
// buffer_body for an upstream's response).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>

#include "http/flat_fields.hpp"

namespace weir::http {

// A body that is a std::string, as Beast's string_body, whose reader
// appends what the parser gives it. string_body's resize-then-copy zeroes
// every byte before it is copied (a memset of the whole body: ~2,000
// instructions for a 2.3 KB prompt); append copies once. init() reserves
// Content-Length, as string_body's does. Errors: buffer_overflow past
// std::string's max_size().
struct AppendStringBody {
  using value_type = std::string;

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& b) : body_(b) {}

    void init(const boost::optional<std::uint64_t>& length, boost::system::error_code& ec) {
      ec = {};
      if (!length) return;
      if (*length > body_.max_size()) {
        ec = boost::beast::http::error::buffer_overflow;
        return;
      }
      body_.reserve(static_cast<std::size_t>(*length));
    }
    std::size_t put(boost::asio::const_buffer b, boost::system::error_code& ec) {
      if (b.size() > body_.max_size() - body_.size()) {
        ec = boost::beast::http::error::buffer_overflow;
        return 0;
      }
      ec = {};
      body_.append(static_cast<const char*>(b.data()), b.size());
      return b.size();
    }
    void finish(boost::system::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};

template <bool isRequest, class Body>
class FlatParser final : public boost::beast::http::basic_parser<isRequest> {
 public:
  using message_type = boost::beast::http::message<isRequest, Body, FlatFields>;
  using string_view = boost::beast::string_view;
  using error_code = boost::system::error_code;

  FlatParser() : rd_(m_.base(), m_.body()) {}
  FlatParser(const FlatParser&) = delete;
  FlatParser& operator=(const FlatParser&) = delete;
  ~FlatParser() override = default;

  // The head had a field value continued on a next line (obs-fold, RFC 9112
  // §5.2: a line starting with SP or HTAB), or a request's trailer section
  // did. A request's is refused (the parse fails with bad_value), as is a
  // response's in Content-Length or Transfer-Encoding; another response
  // field's value stands, each fold replaced by one SP.
  bool obs_fold() const noexcept { return obs_fold_; }

  message_type& get() noexcept { return m_; }
  const message_type& get() const noexcept { return m_; }
  message_type release() noexcept { return std::move(m_); }

  // Called with each chunk's size and extensions (as Beast's
  // parser::on_chunk_header; `cb` is referenced, not copied: it must
  // outlive the parse).
  template <class Callback>
  void on_chunk_header(Callback& cb) {
    cb_h_ = std::ref(cb);
  }

 private:
  void on_request_impl(boost::beast::http::verb method, string_view method_str, string_view target, int version,
                       error_code& ec) override {
    if constexpr (isRequest) {
      if (used_) {
        ec = boost::beast::http::error::stale_parser;
        return;
      }
      used_ = true;
      // The method first: header<true>::method() clears the line's method,
      // which would otherwise copy the target once more.
      if (method != boost::beast::http::verb::unknown)
        m_.method(method);
      else
        m_.method_string(method_str);
      m_.target(target);
      m_.version(version);
    } else {
      (void)method, (void)method_str, (void)target, (void)version, (void)ec;
    }
  }

  void on_response_impl(int code, string_view reason, int version, error_code& ec) override {
    if constexpr (!isRequest) {
      if (used_) {
        ec = boost::beast::http::error::stale_parser;
        return;
      }
      used_ = true;
      m_.result(code);
      m_.version(version);
      m_.reason(reason);
    } else {
      (void)code, (void)reason, (void)version, (void)ec;
    }
  }

  void on_field_impl(boost::beast::http::field name, string_view name_string, string_view value,
                     error_code& ec) override {
    if (this->is_header_done()) [[unlikely]]
      return on_trailer_field(name_string, value, ec);
    if (obs_folded(name_string, value)) [[unlikely]] {
      // RFC 9112 §5.2: a server must refuse obs-fold in a request (or replace it with SP): a proxy in front
      // that keeps the fold would read `Transfer-Encoding:\r\n chunked` as no transfer coding, and the two
      // would frame the body differently. A proxy must refuse it in a response or replace it with SP, which
      // Beast did: the value stands, except in the fields that frame the body.
      obs_fold_ = true;
      if (isRequest || name == boost::beast::http::field::content_length ||
          name == boost::beast::http::field::transfer_encoding) {
        ec = boost::beast::http::error::bad_value;
        return;
      }
    }
    if (name_string.size() > std::numeric_limits<std::uint16_t>::max()) {
      ec = boost::beast::http::error::header_limit;
      return;
    }
    m_.insert(name, name_string, value);
  }

  // A trailer field: dropped (RFC 9110 §6.5.1). A request's obs-folded one
  // is refused as in the head (and Beast refuses Content-Length and
  // Transfer-Encoding there as framing it cannot take): one rule for a
  // request's field lines wherever they come. (Out of line: the head's
  // fields, every request's, keep on_field_impl small.)
  [[gnu::cold, gnu::noinline]] void on_trailer_field(string_view name_string, string_view value, error_code& ec) {
    if (isRequest && obs_folded(name_string, value)) {
      obs_fold_ = true;
      ec = boost::beast::http::error::bad_value;
    }
  }

  void on_header_impl(error_code& ec) override { ec = {}; }

  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length, error_code& ec) override {
    rd_.init(content_length, ec);
  }

  std::size_t on_body_impl(string_view body, error_code& ec) override {
    return rd_.put(boost::asio::buffer(body.data(), body.size()), ec);
  }

  void on_chunk_header_impl(std::uint64_t size, string_view extensions, error_code& ec) override {
    if (cb_h_) cb_h_(size, extensions, ec);
  }

  std::size_t on_chunk_body_impl(std::uint64_t, string_view body, error_code& ec) override {
    return rd_.put(boost::asio::buffer(body.data(), body.size()), ec);
  }

  void on_finish_impl(error_code& ec) override { rd_.finish(ec); }

  // Whether Beast unfolded the value of the field named `name`: the value
  // then does not begin on the field's own line, after the colon and OWS,
  // where Beast hands an unfolded value from (its name and an unfolded value
  // are views into the parsed bytes; a folded one is in Beast's own buffer,
  // or begins on a later line when the first was empty). The bytes read are
  // the parsed line's: it ends in CRLF.
  static bool obs_folded(string_view name, string_view value) noexcept {
    const char* p = name.data() + name.size() + 1;
    while (*p == ' ' || *p == '\t') ++p;
    return p != value.data();
  }

  message_type m_;
  typename Body::reader rd_;
  std::function<void(std::uint64_t, string_view, error_code&)> cb_h_;
  bool used_ = false;
  bool obs_fold_ = false;  // obs_fold()
};

}  // namespace weir::http
