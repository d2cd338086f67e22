// RESP2 values for the Redis client: commands formatted and replies parsed by
// hiredis (redisFormatCommandArgv, redisReader); no I/O here.
// Spec: Redis serialization protocol (RESP2), https://redis.io/docs/reference/protocol-spec/
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <tl/expected.hpp>

namespace weir::store {

// Why a command produced no usable reply.
enum class Errc : std::uint8_t {
  not_connected,    // no connection and none being made (backoff after a failure): not sent
  timeout,          // no reply within the command timeout (the connection is then closed)
  connection_lost,  // the connection closed after the command was queued: it may have run
  server,           // Redis answered with an error reply (-ERR, -NOSCRIPT, ...); message holds it
  protocol,         // the server sent bytes that are not RESP
  stopped,          // Client::stop() ran
};

std::string_view to_string(Errc e) noexcept;

struct Error {
  Errc code = Errc::not_connected;
  std::string message;  // for logs; for Errc::server the error reply text ("NOSCRIPT No matching ...")

  // True when the command certainly did not reach Redis (safe to retry or undo).
  bool not_sent() const noexcept { return code == Errc::not_connected || code == Errc::stopped; }
};

// One reply (RESP2). Owning, so it outlives the parser.
struct Reply {
  enum class Type : std::uint8_t { string, array, integer, nil, status };
  Type type = Type::nil;
  std::int64_t integer = 0;     // Type::integer
  std::string str;              // Type::string, Type::status
  std::vector<Reply> elements;  // Type::array

  bool is_nil() const noexcept { return type == Type::nil; }
  // The integer, or a string reply holding a base-10 integer; `fallback` otherwise.
  std::int64_t as_int(std::int64_t fallback = 0) const noexcept;
};

template <class T>
using Result = tl::expected<T, Error>;

// A Lua script for EVALSHA: its text and its SHA-1 (hex, as SCRIPT LOAD returns it).
class Script {
 public:
  explicit Script(std::string text);
  const std::string& text() const noexcept { return text_; }
  const std::string& sha1() const noexcept { return sha1_; }

 private:
  std::string text_;
  std::string sha1_;
};

// One command, formatted once into RESP bytes (a "*N\r\n$len\r\narg\r\n..." array).
class Command {
 public:
  // Command{"SET", key, value}: each argument anything a std::string_view
  // can be made from. (A variadic constructor rather than an
  // initializer_list: GCC 12 rejects initializer_list temporaries that live
  // across a co_await.)
  template <class... Args>
  requires(sizeof...(Args) > 0 && (std::is_convertible_v<const Args&, std::string_view> && ...))
      Command(const Args&... args) {  // NOLINT(google-explicit-constructor)
    const std::string_view a[] = {std::string_view(args)...};
    format(a);
  }
  explicit Command(std::span<const std::string> args);
  explicit Command(std::span<const std::string_view> args);

  // EVALSHA sha numkeys keys... args...; the client answers NOSCRIPT by
  // SCRIPT LOAD and sends the command again (scripts vanish when Redis restarts).
  static Command evalsha(const Script& script, std::span<const std::string> keys, std::span<const std::string> args);

  const std::string& bytes() const noexcept { return bytes_; }
  // The script an EVALSHA runs, else nullptr.
  const Script* script() const noexcept { return script_; }

 private:
  Command() = default;
  void format(std::span<const std::string_view> args);
  std::string bytes_;
  const Script* script_ = nullptr;
};

// Incremental reply parser over hiredis's redisReader: feed bytes as they
// arrive, take complete replies out. Error replies come out as Errc::server.
class ReplyParser {
 public:
  ReplyParser();
  ~ReplyParser();
  ReplyParser(const ReplyParser&) = delete;
  ReplyParser& operator=(const ReplyParser&) = delete;

  // Appends received bytes. False when the stream is not RESP (the connection must close).
  bool feed(const char* data, std::size_t n);
  // Next complete reply: false when none is buffered yet. `*bad` is set when
  // the stream is not RESP (the connection must close).
  bool next(Result<Reply>& out, bool* bad);
  // Drops buffered bytes (a new connection starts clean).
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `text` as a Redis glob pattern (SCAN/KEYS MATCH, Redis's stringmatchlen)
// that matches exactly that text: each of * ? [ ] \ preceded by a backslash.
// "app?:" -> "app\?:" (the pattern "app?:key:*" also matched "apps:key:...").
std::string glob_literal(std::string_view text);

}  // namespace weir::store
