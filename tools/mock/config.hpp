// weir-mock configuration: command-line flags, fixed for the process lifetime.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weir::mock {

// Everything the command line sets (tools/mock/README.md lists the flags).
// Built once in main() and shared read-only by every worker thread.
struct MockConfig {
  std::string listen_host = "127.0.0.1";  // --listen HOST part
  std::uint16_t listen_port = 8000;       // --listen PORT part; 0 = any free port
  int threads = 1;                        // --threads: workers, each with its own SO_REUSEPORT acceptor
  bool reuse_port = false;                // --reuse-port: start even if another process listens on the address

  int ttft_ms = 90;           // --ttft-ms: request read -> first token, ms
  int itl_ms = 14;            // --itl-ms: between tokens, ms
  int max_tokens = 128;       // --max-tokens: natural generation length, tokens
  int embedding_dim = 16;     // --embedding-dim: default embedding size, floats
  int max_model_len = 32768;  // --max-model-len: reported in /v1/models, tokens

  // --model (repeatable). models.front() is the name vLLM reports back (its
  // first --served-model-name) and the `model_name` metrics label.
  std::vector<std::string> models{"mock-model"};
  bool any_model = false;  // --any-model: accept and echo back every name

  // Fault injection defaults; request headers x-mock-* override per request.
  double error_rate = 0.0;  // --error-rate: probability 0..1 of an injected error
  int error_status = 500;   // --error-status: status of an injected error
  int stall_after = -1;     // --stall-after: tokens sent before the stall; -1 = never
  int stall_ms = 0;         // --stall-ms: stall length, ms
  int reset_after = -1;     // --reset-after: tokens sent before an RST; -1 = never
  double reset_rate = 1.0;  // --reset-rate: probability 0..1 that a generation gets the --reset-after RST

  // The engine model (engine.hpp): 0 = off.
  int prefix_cache_tokens = 0;   // --prefix-cache-tokens: prefix cache capacity (LRU of 16-token blocks), tokens
  int prefill_us_per_token = 0;  // --prefill-us-per-token: first token later by this per uncached prompt token, µs
  int max_num_seqs = 0;          // --max-num-seqs: requests running at once; beyond, they wait (FIFO)

  int tick_us = 1000;          // --tick-us: least time between two scheduler passes, µs
  int keep_alive_s = 5;        // --keep-alive-s: idle keep-alive timeout (uvicorn/vLLM default 5 s)
  bool no_keep_alive = false;  // --no-keep-alive: every response says `connection: close` and the connection ends
  // --stamp: a stream's first token chunk and a non-streamed body carry `"mock_ns": N` as their first member,
  // the ns from the request fully read to that write (weir-bench's per-request added latency).
  bool stamp = false;

  // --tls-cert / --tls-key: serve HTTPS on --listen (both or neither); --tls-no-resume: no session tickets or cache.
  std::string tls_cert;
  std::string tls_key;
  bool tls_no_resume = false;
};

}  // namespace weir::mock
