#include "gateway/endpoints.hpp"

#include <cctype>

namespace weir::gateway {

std::string_view route_label(RouteKind r) {
  switch (r) {
    case RouteKind::chat_completions:
      return "/v1/chat/completions";
    case RouteKind::completions:
      return "/v1/completions";
    case RouteKind::embeddings:
      return "/v1/embeddings";
    case RouteKind::messages:
      return "/v1/messages";
    case RouteKind::messages_count_tokens:
      return "/v1/messages/count_tokens";
    case RouteKind::responses:
      return "/v1/responses";
    case RouteKind::tokenize:
      return "/tokenize";
    case RouteKind::detokenize:
      return "/detokenize";
    case RouteKind::rerank:
      return "/v1/rerank";
    case RouteKind::score:
      return "/v1/score";
    case RouteKind::pooling:
      return "/pooling";
    case RouteKind::classify:
      return "/classify";
    case RouteKind::audio_transcriptions:
      return "/v1/audio/transcriptions";
    case RouteKind::audio_translations:
      return "/v1/audio/translations";
    case RouteKind::version:
      return "/version";
    case RouteKind::models:
      return "/v1/models";
    case RouteKind::health:
      return "/health";
    case RouteKind::ready:
      return "/ready";
    case RouteKind::metrics:
      return "/metrics";
    default:
      return "other";
  }
}

std::string_view path_of(std::string_view target) {
  if (target.starts_with("http://") || target.starts_with("https://")) {
    const auto slash = target.find('/', target.find("://") + 3);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  auto q = target.find('?');
  return q == std::string_view::npos ? target : target.substr(0, q);
}

std::string_view query_of(std::string_view target) {
  const auto q = target.find('?');
  return q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
}

namespace {
// A model id after /v1/models/ (it may hold '/', as is or as %2F:
// "org/model"), without what a server that normalizes paths would read as
// another route: a "." or ".." segment, or a backslash, as written or
// percent-encoded (%2E, %2F, %5C decoded first: "a%2F..%2Fmetrics").
bool plain_model_path(std::string_view rest) {
  const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  std::size_t seg_len = 0;  // bytes of the current segment, decoded
  int dots = 0;             // how many of them are '.'
  for (std::size_t i = 0; i <= rest.size(); ++i) {
    char c = i < rest.size() ? rest[i] : '/';
    if (c == '%' && i + 2 < rest.size() && std::isxdigit(static_cast<unsigned char>(rest[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(rest[i + 2]))) {
      const char d = static_cast<char>(hex(rest[i + 1]) * 16 + hex(rest[i + 2]));
      if (d == '.' || d == '/' || d == '\\') {
        c = d;
        i += 2;
      }
    }
    if (c == '\\') return false;
    if (c == '/') {
      if (seg_len > 0 && dots == static_cast<int>(seg_len) && seg_len <= 2) return false;  // "." or ".."
      seg_len = 0;
      dots = 0;
      continue;
    }
    ++seg_len;
    dots += c == '.';
  }
  return true;
}
}  // namespace

RouteKind classify_path(std::string_view path) {
  if (path == "/v1/chat/completions") return RouteKind::chat_completions;
  if (path == "/v1/completions") return RouteKind::completions;
  if (path == "/v1/embeddings") return RouteKind::embeddings;
  if (path == "/v1/messages") return RouteKind::messages;
  if (path == "/v1/messages/count_tokens") return RouteKind::messages_count_tokens;
  if (path == "/v1/responses") return RouteKind::responses;
  if (path == "/tokenize") return RouteKind::tokenize;
  if (path == "/detokenize") return RouteKind::detokenize;
  if (path == "/rerank" || path == "/v1/rerank" || path == "/v2/rerank") return RouteKind::rerank;
  if (path == "/score" || path == "/v1/score") return RouteKind::score;
  if (path == "/pooling") return RouteKind::pooling;
  if (path == "/classify") return RouteKind::classify;
  if (path == "/v1/audio/transcriptions") return RouteKind::audio_transcriptions;
  if (path == "/v1/audio/translations") return RouteKind::audio_translations;
  if (path == "/version") return RouteKind::version;
  if (path == "/v1/models") return RouteKind::models;
  // (No id, "/v1/models/", or a trailing slash after one, "/v1/models/m/": an unknown path, 404 not_found
  // naming no model, as every other route with a trailing slash, and as vLLM's routes, where a trailing
  // slash is another path. An id that ends in '/' is written %2F.)
  if (path.starts_with("/v1/models/"))
    return path.size() > 11 && path.back() != '/' && plain_model_path(path.substr(11)) ? RouteKind::models
                                                                                       : RouteKind::other;
  if (path == "/health") return RouteKind::health;
  if (path == "/ready") return RouteKind::ready;
  if (path == "/metrics") return RouteKind::metrics;
  return RouteKind::other;
}

std::optional<api::ApiKind> api_of(RouteKind r) {
  switch (r) {
    case RouteKind::chat_completions:
    case RouteKind::messages:
    case RouteKind::messages_count_tokens:
    case RouteKind::responses:
      return api::ApiKind::chat_completions;
    case RouteKind::completions:
      return api::ApiKind::completions;
    case RouteKind::embeddings:
      return api::ApiKind::embeddings;
    case RouteKind::tokenize:
    case RouteKind::detokenize:
    case RouteKind::rerank:
    case RouteKind::score:
    case RouteKind::pooling:
    case RouteKind::classify:
      return api::ApiKind::vllm_extra;
    case RouteKind::audio_transcriptions:
    case RouteKind::audio_translations:
      return api::ApiKind::audio;
    default:
      return std::nullopt;
  }
}

std::string_view allowed_methods(RouteKind r) { return api_of(r) ? "POST" : "GET, HEAD"; }

bool valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  // "." and ".." name no record: a URL's path drops them as dot segments, so neither the admin API's
  // /admin/v1/requests/{request_id} nor the console could reach one (RFC 3986 §5.2.4, WHATWG URL).
  if (id == "." || id == "..") return false;
  for (unsigned char c : id)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}

}  // namespace weir::gateway
