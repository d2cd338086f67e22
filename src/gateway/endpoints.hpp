// The routes Weir serves and how a request target maps to one (OpenAI API
// paths, Anthropic's /v1/messages, OpenAI's /v1/responses; Weir's own
// /health, /ready, /metrics).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "api/request.hpp"

namespace weir::gateway {

// Routes Weir serves; the label of weir_requests_total.
enum class RouteKind : std::uint8_t {
  chat_completions,
  completions,
  embeddings,
  messages,               // Anthropic POST /v1/messages
  messages_count_tokens,  // Anthropic POST /v1/messages/count_tokens
  responses,              // OpenAI POST /v1/responses, translated to chat completions
  // vLLM's other routes (vLLM 0.10 api_server.py), passed through to the
  // model's pool with the same auth, limits and log line:
  tokenize,    // POST /tokenize
  detokenize,  // POST /detokenize
  rerank,      // POST /rerank, /v1/rerank, /v2/rerank (Jina/Cohere shapes)
  score,       // POST /score, /v1/score
  pooling,     // POST /pooling
  classify,    // POST /classify
  // vLLM's (and OpenAI's) speech-to-text routes: multipart/form-data bodies,
  // routed by their `model` field, answered as JSON, text or an SSE stream.
  audio_transcriptions,  // POST /v1/audio/transcriptions
  audio_translations,    // POST /v1/audio/translations
  version,               // GET /version: the default pool's (else the first pool's) vLLM version
  models,
  health,
  ready,
  metrics,
  other,
  count_,
};
std::string_view route_label(RouteKind r);

// The path of a request target: origin-form "/p?q", or absolute-form
// "http://host/p?q", which a server must accept too (RFC 9112 §3.2.2).
std::string_view path_of(std::string_view target);
// Its query: what follows the first '?', undecoded ("" when none).
std::string_view query_of(std::string_view target);
RouteKind classify_path(std::string_view path);

// The OpenAI API a POST route speaks upstream (the Anthropic and Responses
// routes: chat_completions), or nullopt for Weir's own GET routes.
std::optional<api::ApiKind> api_of(RouteKind r);
// True for vLLM's non-generating JSON routes (tokenize … classify): no
// completion tokens, no stream; routed by `model`, or to the default pool
// when the body has none.
inline bool is_vllm_extra(RouteKind r) { return r >= RouteKind::tokenize && r <= RouteKind::classify; }
// True for the Anthropic Messages routes: the body is translated for an
// OpenAI-compatible upstream and the answer back (api/anthropic/).
// True for the speech-to-text routes: multipart bodies (api::parse_audio_request).
inline bool is_audio(RouteKind r) { return r == RouteKind::audio_transcriptions || r == RouteKind::audio_translations; }
inline bool is_anthropic(RouteKind r) { return r == RouteKind::messages || r == RouteKind::messages_count_tokens; }
// True for OpenAI's Responses route: translated to chat completions and
// back (api/responses/).
inline bool is_responses(RouteKind r) { return r == RouteKind::responses; }
// True when the client's body is not the upstream's: the routes above.
inline bool is_translated(RouteKind r) { return is_anthropic(r) || is_responses(r); }
// True for the routes whose answer is generated text (a completion, a message, a response, a transcript):
// what an answer of theirs without usage is charged for (docs/admission.md, "No usage reported"). Not a
// model list, a rerank's documents or a pooling's vectors: no text of theirs was generated.
inline bool generates_text(RouteKind r) {
  return r == RouteKind::chat_completions || r == RouteKind::completions || r == RouteKind::messages ||
         r == RouteKind::responses || is_audio(r);
}
// True for the routes a `type: anthropic` pool serves (docs/protocols.md,
// "Anthropic as the upstream"): chat completions and Responses translated
// into Anthropic's Messages API, the Anthropic routes as they came.
inline bool served_by_anthropic(RouteKind r) {
  return r == RouteKind::chat_completions || r == RouteKind::responses || is_anthropic(r);
}
// Methods a route accepts: "POST" for the API routes, "GET, HEAD" for the
// others (the Allow field of a 405).
std::string_view allowed_methods(RouteKind r);

// An x-request-id Weir passes on: 1..128 visible ASCII characters, not "." or "..".
bool valid_request_id(std::string_view id);

}  // namespace weir::gateway
