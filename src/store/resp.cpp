#include "store/resp.hpp"

#include <charconv>

#include <hiredis/hiredis.h>
#include <openssl/evp.h>

namespace weir::store {

std::string_view to_string(Errc e) noexcept {
  switch (e) {
    case Errc::not_connected:
      return "not connected";
    case Errc::timeout:
      return "timeout";
    case Errc::connection_lost:
      return "connection lost";
    case Errc::server:
      return "server error";
    case Errc::protocol:
      return "protocol error";
    case Errc::stopped:
      return "stopped";
  }
  return "unknown";
}

std::int64_t Reply::as_int(std::int64_t fallback) const noexcept {
  if (type == Type::integer) return integer;
  if (type == Type::string || type == Type::status) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(str.data(), str.data() + str.size(), v);
    if (ec == std::errc() && p == str.data() + str.size()) return v;
  }
  return fallback;
}

Script::Script(std::string text) : text_(std::move(text)) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(text_.data(), text_.size(), md, &len, EVP_sha1(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  sha1_.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    sha1_.push_back(kHex[md[i] >> 4]);
    sha1_.push_back(kHex[md[i] & 15]);
  }
}

Command::Command(std::span<const std::string_view> args) { format(args); }

Command::Command(std::span<const std::string> args) {
  std::vector<std::string_view> v(args.begin(), args.end());
  format(v);
}

Command Command::evalsha(const Script& script, std::span<const std::string> keys, std::span<const std::string> args) {
  const std::string numkeys = std::to_string(keys.size());
  std::vector<std::string_view> v;
  v.reserve(3 + keys.size() + args.size());
  v.push_back("EVALSHA");
  v.push_back(script.sha1());
  v.push_back(numkeys);
  v.insert(v.end(), keys.begin(), keys.end());
  v.insert(v.end(), args.begin(), args.end());
  Command c;
  c.format(v);
  c.script_ = &script;
  return c;
}

void Command::format(std::span<const std::string_view> args) {
  std::vector<const char*> argv(args.size());
  std::vector<std::size_t> lens(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    argv[i] = args[i].data();
    lens[i] = args[i].size();
  }
  char* out = nullptr;
  const int n = redisFormatCommandArgv(&out, static_cast<int>(args.size()), argv.data(), lens.data());
  if (n > 0 && out) bytes_.assign(out, static_cast<std::size_t>(n));
  redisFreeCommand(out);
}

namespace {

Result<Reply> convert(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_ERROR:
      return tl::unexpected(Error{Errc::server, std::string(r->str, r->len)});
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::string;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) {
        auto e = convert(r->element[i]);
        // An error nested in an array (EXEC, script tables) is kept as a status-like string.
        if (!e) {
          Reply s;
          s.type = Reply::Type::status;
          s.str = std::move(e.error().message);
          out.elements.push_back(std::move(s));
        } else {
          out.elements.push_back(std::move(*e));
        }
      }
      break;
    default:
      out.type = Reply::Type::nil;
      break;
  }
  return out;
}

}  // namespace

struct ReplyParser::Impl {
  redisReader* reader = nullptr;
};

ReplyParser::ReplyParser() : impl_(std::make_unique<Impl>()) { impl_->reader = redisReaderCreate(); }

ReplyParser::~ReplyParser() {
  if (impl_->reader) redisReaderFree(impl_->reader);
}

bool ReplyParser::feed(const char* data, std::size_t n) { return redisReaderFeed(impl_->reader, data, n) == REDIS_OK; }

bool ReplyParser::next(Result<Reply>& out, bool* bad) {
  void* raw = nullptr;
  if (redisReaderGetReply(impl_->reader, &raw) != REDIS_OK) {
    *bad = true;
    return false;
  }
  if (!raw) return false;
  auto* r = static_cast<redisReply*>(raw);
  out = convert(r);
  freeReplyObject(r);
  return true;
}

void ReplyParser::reset() {
  redisReaderFree(impl_->reader);
  impl_->reader = redisReaderCreate();
}

std::string glob_literal(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace weir::store
