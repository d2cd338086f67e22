// Weir's configuration: one immutable snapshot built at start-up from YAML
// (`weir --config FILE`) or from the quick-mode flags, shared read-only by
// every worker thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/host_rule.hpp"
#include "core/ip_net.hpp"
#include "core/yaml.hpp"

namespace weir::core {

using Millis = std::chrono::milliseconds;

// Where to accept downstream connections.
struct ListenAddress {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;

  bool operator==(const ListenAddress&) const = default;
};

// Label dimensions of /metrics (server.metrics): which identity labels the
// request, token, spend and rate-limit counters carry, and how many distinct
// values each may take before the rest share the value `other`.
struct MetricsConfig {
  bool tenant_label = true;         // a `tenant` label (when tenants are configured)
  std::uint32_t max_tenants = 100;  // tenants with a label value of their own (in name order); the rest: "other"
  bool key_id_label = false;        // a `key_id` label for API-key requests
  std::uint32_t max_key_ids =
      100;                  // configured keys with their own value (config order); the rest, and Redis keys: "other"
  bool client_port = true;  // GET /metrics on the client port too (always on the admin listener)
  bool operator==(const MetricsConfig&) const = default;
};

// Cross-origin requests from browsers (server.cors), answered as the Fetch
// standard's CORS protocol asks (https://fetch.spec.whatwg.org/#http-cors-protocol;
// gateway/cors.hpp). Off unless the section is given: a gateway that holds
// API keys opens itself to no web page by default (vLLM's own default is
// every origin, `--allowed-origins '["*"]'`).
struct CorsConfig {
  bool enabled = false;
  bool any_origin = false;           // allowed_origins is ["*"]: `Access-Control-Allow-Origin: *`
  std::vector<std::string> origins;  // serialized origins, lower-case: "https://app.example.com[:port]"
  bool any_header = false;           // allowed_headers holds "*": every requested header is granted
  // Request header names granted to a preflight, lower-case; one ending in
  // '*' grants every name with that prefix ("x-stainless-*").
  std::vector<std::string> headers;
  std::string expose_headers;      // Access-Control-Expose-Headers' value on every answer ("" = none)
  std::uint32_t max_age_s = 600;   // Access-Control-Max-Age of a preflight, seconds
  bool allow_credentials = false;  // `Access-Control-Allow-Credentials: true` (never with any_origin)
  bool operator==(const CorsConfig&) const = default;
};

// Downstream (client-facing) limits and timeouts.
struct ServerConfig {
  ListenAddress listen;
  unsigned workers = 0;                              // 0 = one per core
  std::uint64_t max_body_bytes = 4u << 20;           // request body limit → 413
  std::uint32_t max_header_bytes = 64u << 10;        // request head limit → 431
  Millis header_timeout{10'000};                     // first byte to end of head
  Millis body_timeout{60'000};                       // end of head to end of body
  Millis keepalive_timeout{130'000};                 // idle between requests: above front proxies' (Caddy 120 s)
  Millis write_timeout{30'000};                      // one write to the client may take this long
  std::uint64_t max_stream_buffer_bytes = 1u << 20;  // per-stream output backlog before cut-off
  std::uint64_t max_response_bytes = 256u << 20;     // buffered non-streaming upstream body
  std::uint64_t max_event_bytes = 4u << 20;          // one SSE event of an upstream's stream
  Millis drain_timeout{30'000};                      // SIGTERM: streams may finish this long
  std::string access_log = "-";                      // "-" stdout, "off", or a file path
  bool reuse_port = false;                           // start even if another process listens on `listen`, sharing it
  MetricsConfig metrics;                             // label dimensions of /metrics
  CorsConfig cors;                                   // browsers' cross-origin requests (off by default)
  // The hosts a request on the client listener may name (its Host, or an
  // absolute-form target's authority): server.allowed_hosts, parsed by
  // gateway::load_config (gateway::parse_allowed_hosts: an entry is checked
  // as a Host value is, which is http's). nullopt = the default
  // (gateway::client_host_rule: on a loopback listener, IP literals and
  // localhost for the requests that need no credential; any host else).
  std::optional<HostRule> allowed_hosts;
  // server.trusted_proxies: the front proxies (load balancers) whose
  // X-Forwarded-For, X-Real-IP and Forwarded Weir believes. Empty (the
  // default): none, and a request's client is its connection's peer
  // (http/client_address.hpp).
  std::vector<IpNet> trusted_proxies;
  // When GET /ready answers 503 besides draining (docs/reliability.md#readiness):
  // all = while any pool has no endpoint available on any worker, any = while
  // no pool has one, off = draining only.
  enum class ReadyPools : std::uint8_t { all, any, off } ready_pools = ReadyPools::all;
  // Reload the configuration file when it changes (besides SIGHUP): how
  // often its size, time and inode are looked at; 0 = off (the default).
  Millis watch_config{0};
  // server.max_buffered: the bytes request bodies and whole (non-streamed) upstream answers may hold at
  // once, summed over the process (core/buffer_budget.hpp); a request that would take it over gets 503
  // gateway_overloaded. 0 = no bound. When set, at least max_body and max_response; unset, 1GiB or the
  // larger of those two.
  std::uint64_t max_buffered_bytes = std::uint64_t{1} << 30;
};

// Upstream timeouts of one pool.
struct UpstreamTimeouts {
  Millis connect{2'000};  // TCP connect to an endpoint
  // A streamed request written → its response head (vLLM sends it at once:
  // queueing, not the generation).
  Millis first_byte{120'000};
  // A non-streamed request written → its response head: vLLM sends that
  // head only when the whole generation is done, so this bounds the
  // generation (the openai SDK's own default timeout is 600 s). Unset: 600 s,
  // or first_byte when that is set (a pool that set first_byte before this
  // key existed bounds every head by it, as it did).
  Millis response{600'000};
  Millis idle{60'000};  // between two reads of the response (between SSE events)
  // A stream's request written → its first SSE data event (vLLM sends the
  // response head at once and the first token at TTFT, so first_byte does
  // not see a stall before the first token); 0 = off (idle alone bounds it).
  Millis first_token{0};
};

// One model server: http://host:port or https://host[:port][/base]. Addresses
// are resolved once at start-up.
struct EndpointConfig {
  std::string url;          // as written in the config: may hold a query with secrets, never print it
  std::string display;      // core::redact_url(url): what logs and messages show
  std::string host;         // host part, for the Host header, SNI and certificate verification
  std::uint16_t port = 80;  // 80 for http://, 443 for https:// unless given
  std::string host_header;  // "host:port" as sent upstream (no port when it is the scheme's default)
  bool tls = false;         // https://
  // The URL's path without a trailing '/' ("" for the server root): an
  // OpenAI-style base URL such as https://api.openai.com/v1 or an Azure
  // deployment base (http/forward.hpp's append_upstream_target maps the
  // request's path onto it).
  std::string base_path;
  std::string query;  // the URL's query without '?' ("" for none), appended to every request target
  int line = 0;       // where the configuration file gives it (1-based; 0 when not from a file)
  int column = 0;

  // The same endpoint: the same URL (every other member is read from it), wherever the file writes it.
  bool operator==(const EndpointConfig& o) const { return url == o.url; }
};

// TLS to a pool's https:// endpoints (OpenSSL through Asio's SSL stream).
struct TlsConfig {
  std::string ca_file;      // PEM bundle of trusted CAs; empty = the system store (/etc/ssl/certs)
  bool verify = true;       // verify the certificate chain and name; false is for tests only (loudly logged)
  std::string server_name;  // SNI and the name verified; empty = the endpoint URL's host
  std::string client_cert;  // PEM certificate chain for mutual TLS; empty = none
  std::string client_key;   // PEM private key of client_cert
};

// What speaks at the other end of a pool's endpoints.
enum class UpstreamType : std::uint8_t {
  openai,     // an OpenAI-compatible server: vLLM, SGLang, a hosted OpenAI-compatible API (the default)
  anthropic,  // Anthropic's Messages API (POST /v1/messages): docs/upstreams.md, docs/protocols.md
};

// A `type: anthropic` pool's wire settings (docs/upstreams.md).
struct AnthropicUpstreamConfig {
  // The anthropic-version header sent on every request (Anthropic API
  // reference, "Versions"): the client's own is replaced, since Weir reads
  // and translates the answers in this version.
  std::string version = "2023-06-01";
  // max_tokens sent for a chat completion (or Responses request) that gives
  // none: Anthropic requires it. 4096 is the largest output every Claude
  // model accepts (Claude 3 Haiku and Opus stop at 4096), so the default
  // never turns a valid request into a 400; tokens.
  std::uint32_t max_tokens = 4096;
};

// Retries of a request on one pool, only while nothing has reached the
// client (docs/reliability.md). Which failures: a connect failure (another
// endpoint), a reset or a first-byte timeout before the response head, and
// a response head with status 408, 429, 502, 503, 504 or 529 (Anthropic's
// overloaded_error); never another 4xx,
// and never once a byte of the response went to the client.
struct RetryConfig {
  std::uint32_t attempts =
      1;               // tries per request on this pool, 1..10 (1: connect failover and stale-connection resend only)
  Millis backoff{25};  // base of the exponential backoff with full jitter before a retry
  Millis max_backoff{1'000};      // cap of one backoff
  Millis retry_after_cap{2'000};  // a 429/503 Retry-After longer than this is not waited for on this pool
  // Retry budget (Envoy's retry_budget): retries in flight at most this
  // fraction of the pool's requests in flight (per worker), but always at
  // least `min_concurrent`; beyond it a failure is not retried.
  double budget = 0.2;
  std::uint32_t min_concurrent = 3;
  // Retry a non-streamed request whose answer's head did not come within
  // timeouts.response after the request was written whole (as any timeout
  // before the head: on by default). Off: such a timeout ends the request's
  // tries on the pool (its generation may still be running upstream, and
  // another attempt would start it again from scratch).
  bool response_timeout = true;
};

// Passive outlier detection (docs/reliability.md): an endpoint whose
// answers fail `consecutive_failures` times in a row (a 5xx status, a reset
// or timeout before the head, a stream's first-token timeout) is ejected
// (its breaker opens, routing/health.hpp) for the pool's eject_for, doubling
// per ejection in a row; one whose median TTFT over its last streams is
// `ttft_factor` times the pool's median or more is ejected too. Neither
// ejects beyond max_ejected_percent of the pool (failures may, with a
// `breaker` section: see BreakerConfig).
struct OutlierConfig {
  std::uint32_t consecutive_failures = 5;  // 0 = off
  std::uint32_t max_ejected_percent = 50;  // 0..100
  double ttft_factor = 0;                  // 0 = off; else > 1
  std::uint32_t ttft_min_samples = 20;     // streams an endpoint must have had (of its last 32) to be judged
};

// The circuit breaker of each endpoint (docs/reliability.md, routing/health.hpp).
// Every ejection is the breaker's open state; with this section the open
// period ends in a half-open state that lets `half_open_trials` requests at
// a time through (a success closes it, a failure reopens it for twice as
// long, up to max_open_for); failed answers open it whatever share of the
// pool is open already; and a pool whose every endpoint is open sends its
// requests on to the model's fallback at once, or answers 503 with
// Retry-After. Without it an ejection ends by time alone (Envoy's outlier
// detection) and a pool whose every endpoint is ejected still tries one.
struct BreakerConfig {
  bool enabled = false;                // a `breaker:` section is present
  std::uint32_t half_open_trials = 1;  // requests let through at once when half-open, 1..1000
  Millis max_open_for{0};              // cap of the doubling; 0 = 16 x eject_for
};

// The pool's admission queue, per worker (docs/reliability.md#overload).
// A request goes on at once while this worker has fewer than
// `max_concurrent` requests on the pool (0: no limit) and the pool is not
// saturated; otherwise it waits, highest priority first
// (tenants.X.priority, or a lower x-weir-priority), at most `timeout`. When
// `size` requests wait already, the lowest-priority one of them and the
// newcomer is shed with `shed_status` and Retry-After.
struct QueueConfig {
  bool enabled = false;              // a `queue:` section is present
  std::uint32_t size = 64;           // requests waiting per worker, 0..100000 (0: shed at once)
  std::uint32_t max_concurrent = 0;  // requests in flight per worker on the pool before queueing; 0 = no limit
  Millis timeout{5'000};             // longest wait in the queue
  int shed_status = 503;             // 503 or 429
  Millis retry_after{1'000};         // a shed answer's wait: exact in retry-after-ms, rounded up in Retry-After
  // The Gateway API Inference Extension's saturation detector: an endpoint
  // is saturated when its vllm:num_requests_waiting is at least `waiting`
  // or its vllm:kv_cache_usage_perc at least `kv_cache` (from load_metrics);
  // the pool is when every endpoint with a fresh scrape is (one without
  // counts as free). Turns load_metrics on.
  bool saturation = true;
  std::uint32_t saturation_waiting = 5;
  double saturation_kv_cache = 0.8;
};

// Active health probes (docs/reliability.md): every `interval`, each worker
// sends `GET path` to each endpoint on a fresh connection; after
// `unhealthy_after` failed probes in a row (refused, timed out, not 2xx)
// the endpoint is ejected until a probe succeeds again.
struct HealthConfig {
  bool enabled = false;  // a `health:` section is present
  std::string path = "/health";
  Millis interval{5'000};
  Millis timeout{1'000};
  std::uint32_t unhealthy_after = 2;
};

// How a pool picks an endpoint for a request (docs/routing.md).
//   p2c             power of two choices on this worker's in-flight requests
//   least_load      the endpoint with the least load (vLLM's running + waiting
//                   from its /metrics, plus this worker's in-flight change since)
//   prefix_affinity the endpoint that most likely holds the prompt's prefix in
//                   its KV cache (shared prefix index), unless loads diverge
enum class Balance : std::uint8_t { p2c, least_load, prefix_affinity };

// Load from each endpoint's own metrics (vLLM's Prometheus /metrics:
// vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc), scraped off the request path by one scraper on
// the control thread. On by default when balance is least_load or
// prefix_affinity or a session_header is set; `load_metrics: false` turns it off.
struct LoadMetricsConfig {
  bool enabled = false;
  std::string path = "/metrics";
  Millis interval{500};
  Millis timeout{250};  // connect + request + whole response
};

// The imbalance guard of least_load's peers (SGLang's cache-aware router:
// balance_abs_threshold, balance_rel_threshold): loads "diverge" when
// max - min > absolute and max > relative * min. Then prefix_affinity sends
// to the least-loaded endpoint, and a session leaves an endpoint that is that
// far above the least-loaded one.
struct ImbalanceConfig {
  std::uint32_t absolute = 8;  // SGLang: 64; measured in bench/results/routing.md
  double relative = 1.5;
};

// The prefix index of balance: prefix_affinity (docs/routing.md): chained
// hashes of `block_bytes`-byte blocks of the prompt text, seeded by the
// model, in a table of `index_entries` slots (8 bytes each) shared by every
// worker, evicted least-recently-used per 8-slot bucket.
struct PrefixAffinityConfig {
  std::uint32_t block_bytes = 64;          // ~16 tokens: one vLLM KV block
  std::uint32_t max_blocks = 256;          // blocks of a prompt considered (16 KiB at 64 B)
  std::uint32_t index_entries = 1u << 19;  // slots (x 8 bytes: 4 MiB)
  double match_threshold = 0.5;            // matched / hashed blocks at or above which the match wins
};

// A set of interchangeable endpoints serving the same models.
// Micro-batching (docs/batching.md): compatible /v1/completions requests
// that reach one worker within `window` of each other become one upstream
// request with a prompt list; a batch leaves when it has `max_size` members
// or when its window ends, whichever comes first.
struct BatchConfig {
  Millis window{0};             // since the batch's first member; 0 = off
  std::uint32_t max_size = 16;  // members, 2..256
  bool enabled() const { return window.count() > 0 && max_size > 1; }
};

struct PoolConfig {
  std::string name;
  std::vector<EndpointConfig> endpoints;
  UpstreamTimeouts timeouts;
  std::uint32_t max_idle_per_endpoint = 512;  // idle keep-alive connections kept per worker
  Millis idle_keepalive{4'000};               // drop idle connections older than this (uvicorn closes at 5 s)
  std::string api_key;                        // the upstream's credential; empty = none
  std::string api_key_env;                    // the environment variable api_key came from (for messages)
  UpstreamType type = UpstreamType::openai;
  AnthropicUpstreamConfig anthropic;  // type: anthropic only
  // Header lines (each ending in CRLF) Weir adds to every request to the
  // pool, probes and scrapes included, rendered once at load: the
  // credential ("Authorization: Bearer <api_key>" for openai pools,
  // "x-api-key: <api_key>" for anthropic ones) and, for anthropic pools,
  // "anthropic-version: <version>". Empty for a keyless openai pool.
  std::string upstream_lines;
  TlsConfig tls;            // used by https:// endpoints
  Millis eject_for{2'000};  // an endpoint that refuses connections is skipped this long
  // Ask the upstream for stream_options.include_usage on streams whose client
  // did not (and drop that usage chunk from the client's stream), so every
  // stream's tokens are known to the log, metrics, limits and budgets.
  bool request_usage = true;
  // Ask for vLLM's stream_options.continuous_usage_stats on the streams Weir
  // translates from Anthropic's Messages API (/v1/messages), so that
  // message_start carries the prompt's input_tokens: vLLM then puts the
  // usage on every chunk, its first (role) chunk included. A server that
  // refuses unknown request fields (hosted OpenAI) must not get it:
  // `continuous_usage: auto` (the default) is on when every endpoint is
  // http:// (a self-hosted server: vLLM, SGLang, which read it; others ignore
  // unknown fields) and off when one is https:// (hosted APIs); true/false
  // decide. Resolved at load; false for type: anthropic.
  bool continuous_usage = true;
  RetryConfig retry;
  OutlierConfig outlier;
  BreakerConfig breaker;
  QueueConfig queue;
  HealthConfig health;
  BatchConfig batch;
  // Request coalescing (docs/batching.md): identical deterministic chat and
  // completions requests in flight at once share one upstream generation.
  bool coalesce = false;
  // Resume mid-stream (docs/upstreams.md#resume-mid-stream): a chat
  // completions stream whose upstream broke after content reached the
  // client continues on another endpoint from the text received so far
  // (vLLM's continue_final_message). Off by default.
  bool resume = false;
  Balance balance = Balance::p2c;
  LoadMetricsConfig load_metrics;
  ImbalanceConfig imbalance;
  PrefixAffinityConfig prefix_affinity;
  // Session affinity: requests with the same value of this header go to the
  // same endpoint (rendezvous hashing on the endpoint's host:port, so every
  // Weir replica agrees), unless it is ejected or saturated. Empty = off.
  std::string session_header;
};

// One step of a model's fallback chain: another pool, under its own upstream model name.
struct FallbackTarget {
  std::size_t pool = 0;        // index into Config::pools
  std::string upstream_model;  // name sent upstream; empty = leave the body's model as the client sent it
  // {model: M}: M, which a request's principal must be allowed (its
  // tenant's and key's `models`) for the target to take it; empty for
  // {pool: P} (the same model on another pool).
  std::string model;
};

// A model name clients may ask for, and where it goes.
struct ModelConfig {
  std::string name;                  // canonical name, listed by GET /v1/models
  std::size_t pool = 0;              // index into Config::pools
  std::string upstream_model;        // name sent upstream; empty = same as `name`
  std::vector<std::string> aliases;  // other names clients may use
  std::string owned_by = "weir";
  // The model's context length in tokens (prompt and completion), listed as `max_model_len` by GET /v1/models
  // in OpenAI's shape, as vLLM lists its --max-model-len (clients size prompts by it). 0: not configured, and
  // not listed (Weir does not fetch it from the pool, and never makes one up). 1..1,000,000,000.
  std::uint32_t max_model_len = 0;
  // Completion tokens assumed for a request that gives no max_tokens /
  // max_completion_tokens: the admission estimate and the budget reservation
  // (docs/admission.md). Not sent upstream.
  std::uint32_t default_max_tokens = kDefaultMaxTokens;
  static constexpr std::uint32_t kDefaultMaxTokens = 256;
  // Prompt tokens the admission estimate counts per media part (an image, audio, video or document part:
  // api::RequestFields::media_parts), whose bytes do not predict its tokens (docs/admission.md). 576: an
  // image in LLaVA's 24×24 patch grid (an OpenAI 1024×1024 high-detail image is 765, Gemma 3's 256,
  // Qwen2.5-VL's ~1,300 for 1024×1024). Not sent upstream.
  std::uint32_t media_tokens = kDefaultMediaTokens;
  static constexpr std::uint32_t kDefaultMediaTokens = 576;
  // Tried in order when the primary pool's attempts are spent (docs/reliability.md):
  // `fallbacks: [{model: M}, {pool: P, upstream_model: N}]`; {model: M} means M's pool and upstream name.
  std::vector<FallbackTarget> fallbacks;
  static constexpr std::size_t kMaxFallbacks = 4;
  // At most this many models (`models:` entries; aliases not counted): the metrics' model label slots
  // (gateway::MetricLabels) hold a configuration's models and those a reload removed while requests of an
  // earlier configuration still run, within 2 x 65535.
  static constexpr std::size_t kMaxModels = 65535;
};

struct Config {
  std::string source;  // file the snapshot came from, "<flags>" in quick mode
  ServerConfig server;
  std::vector<PoolConfig> pools;
  std::vector<ModelConfig> models;
  // Pool for models not listed (quick mode, or `default_pool:`); the model
  // name passes through unchanged.
  std::optional<std::size_t> default_pool;
  // The parsed document, for modules that read their own sections (auth,
  // tenants, pricing, redis: all through gateway::load_config).
  YAML::Node root;

  std::optional<std::size_t> find_pool(std::string_view name) const;
};

// Parses and validates a YAML document's core sections (listen, workers,
// server, pools, models, default_pool); other top-level keys than these and
// auth, tenants, pricing, redis are errors. Errors name the file, line and
// key. The auth, tenants, pricing and redis sections are validated by
// gateway::load_config, which start-up and --check both use.
ConfigResult<Config> parse_config(std::string_view yaml_text, std::string file_name);
// The environment-variable reference a configuration value was left with:
// "${NAME}" anywhere in it, or "$NAME" as the whole value (NAME: a letter or
// '_', then letters, digits, '_'), as a shell or envsubst would have
// expanded it; nullopt when there is none. Weir expands nothing in its
// file: such a value would be used as it is (an upstream sent "Bearer
// ${UPSTREAM_KEY}").
std::optional<std::string> env_reference(std::string_view value);
// Fails on the first secret or URL value of the configuration (pools' api_key and endpoints, admin.token_sha256,
// auth.api_keys[].sha256, auth.jwt.jwks_url, redis.url/username/password, request_log.url,
// tracing.otlp_endpoint and headers) that is an env_reference(), naming the key, the reference and where a
// value from the environment goes instead (api_key_env, token_env, ..., or envsubst for a URL). parse_config
// calls it before any section is read, so --check and start-up refuse it alike.
ConfigResult<void> check_env_references(const YAML::Node& root);

// Reads `path` and parses it; a missing file is a ConfigError too.
ConfigResult<Config> load_config_file(const std::string& path);
// Whether the configuration at `path` can be read again (a reload, a
// watch): a regular file, after symbolic links. A pipe (`weir -c <(envsubst
// < weir.yaml)`: /dev/fd/N) or another special file gives its text once.
bool config_rereadable(const std::string& path);
// Quick mode: every model goes to `upstream_url` (e.g. http://127.0.0.1:8000).
ConfigResult<Config> quick_config(std::string_view listen, std::string_view upstream_url);

// "host:port" → ListenAddress; "[::1]:8080" for IPv6.
ConfigResult<ListenAddress> parse_listen(std::string_view s);
// "http://host[:port][/]" → EndpointConfig (RFC 3986 URI). Only http:// is
// supported; userinfo ("user:pass@") is refused, as it would be logged and is
// never sent (an upstream's key goes in the pool's api_key or api_key_env).
// A query is accepted but not sent upstream. No error message echoes `url`
// other than through core::redact_url.
ConfigResult<EndpointConfig> parse_endpoint_url(std::string_view url);

}  // namespace weir::core
