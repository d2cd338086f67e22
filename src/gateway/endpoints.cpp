#include "gateway/endpoints.hpp"

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
  if (path == "/v1/models" || path.starts_with("/v1/models/")) return RouteKind::models;
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
  for (unsigned char c : id)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}

}  // namespace weir::gateway
