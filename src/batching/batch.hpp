// The micro-batcher and stream demultiplexer (docs/batching.md).
//
// A MicroBatcher per worker and pool (pools.X.batch, pools.X.coalesce) collects compatible
// /v1/completions requests (api/openai/batch.hpp decides which) for at most
// `window` or until `max_size` have joined, then sends them upstream as one
// request with a prompt list. Each request's respond phase reads its own
// BatchMember, a ResponseSource: the batch's single upstream stream is
// demultiplexed here, once, by choice index, into one byte queue per member
// (its own id, index 0, its own usage), and each member's responder relays
// its queue as if it came from its own upstream. Everything runs on the
// worker's thread: no locks.
//
// Coalescing (pools.X.coalesce) reuses the same machinery: identical
// deterministic requests share one generation, sent at once, and each
// member gets every event with its own response id; one that joins late
// first gets the events already relayed.
//
// Members were authenticated, admitted and are logged one by one (the
// gateway's phases); the batch only shares the upstream request. A member
// that leaves is dropped alone (one that leaves after a prompt list was
// sent is charged its prompt's generation: BatchMember::lingering()); when
// every member has left, the upstream request is aborted (vLLM then stops
// generating).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai/batch.hpp"
#include "api/usage.hpp"
#include "core/async.hpp"
#include "core/config.hpp"
#include "http/forward.hpp"
#include "http/response_source.hpp"
#include "routing/attempts.hpp"
#include "routing/pool.hpp"

namespace weir::batching {

// Counters for the gateway's metrics (summed over workers at scrape time).
struct Stats {
  std::uint64_t batches = 0;    // upstream requests sent for batches
  std::uint64_t members = 0;    // requests sent as members of those batches
  std::uint64_t aborted = 0;    // batches whose upstream request was aborted: every member had left
  std::uint64_t split = 0;      // batches the upstream refused whole (400/413/422): members resent one by one
  std::uint64_t coalesced = 0;  // requests that shared a generation another request started (pools.X.coalesce)
};

class Batch;
class MicroBatcher;

// One request's place in a batch, and the response source its responder
// reads. Owned by the request's session and reused across its requests.
class BatchMember final : public http::ResponseSource {
 public:
  // What the batch needs of the request, valid from join() until its head
  // arrives (the request's head and body are the session's until then).
  struct Request {
    const http::RequestHead* head = nullptr;  // the client's request: its end-to-end fields go upstream
    std::string_view target;                  // upstream request target ("/v1/completions")
    std::string_view prompt;                  // batch: the member's prompt, a JSON string (quotes included)
    std::string_view body;                    // coalesce: the member's upstream body
    std::string_view request_id;              // the member's upstream x-request-id (its response id comes from it)
    bool stream = false;                      // SSE response; else one JSON body
    bool include_usage = false;               // its body asks for the final usage chunk
    bool continuous_usage = false;            // its body asks for usage on every chunk
    bool strip_credentials = false;           // the client's Authorization / x-api-key never go upstream
    // W3C Trace Context to send upstream in place of the client's (tracing:); empty = the client's pass.
    std::string_view traceparent;
    std::string_view tracestate;
    // The client's address, last in the X-Forwarded-For sent upstream (a batch's: its first member's, when
    // every member is of its tenant).
    std::string_view client_address;
    // The client as Weir resolved it (Downstream::client_address), sent as X-Real-IP (a batch's: its first
    // member's, when every member is of its tenant).
    std::string_view real_ip;
    // Its connection's peer is one of server.trusted_proxies (UpstreamHeadOptions::trusted_peer).
    bool trusted_peer = false;
    // The member's tenant (empty without auth): a batch whose members are not all of one tenant sends of its
    // first member's fields only Content-Type and Accept upstream (UpstreamHeadOptions::shared).
    std::string_view tenant;
    // What the pool's balance picks an endpoint by (its session_header's
    // value, the model and prompt for prefix_affinity), as for the member
    // alone: a batch or generation goes where its first member would.
    routing::PickRequest pick;
  };

  explicit BatchMember(core::Executor ex) : ev_(ex) {}
  ~BatchMember() override;
  BatchMember(const BatchMember&) = delete;
  BatchMember& operator=(const BatchMember&) = delete;

  // The compatibility key buffer: api::openai::completion_batch_key's (the
  // body template), then a NUL and http::append_forwarded_fields_key's.
  std::string& key() { return key_; }
  // Waits until the batch has the upstream's response head (true), or
  // failed before it (false: failure() says why; cancelled when the member
  // left).
  core::Task<bool> wait_head();
  http::UpstreamFailure failure() const { return failure_; }
  // wait_head() returned false because the upstream refused the batch as a
  // whole (400, 413 or 422 for a list: one member's prompt can fail them
  // all): the member must be sent on its own. `split_status()` is the
  // batch's answer.
  bool resend_alone() const { return split_status_ != 0; }
  int split_status() const { return split_status_; }
  // wait_head() returned true, but the head's body was not relayed: an error
  // status to a list of several prompts, whose body may quote any member's
  // prompt. The member answers head().result_int() with an error of its own.
  bool body_withheld() const { return withheld_; }
  // wait_head() returned false (failure() protocol) because the upstream's
  // answer was no answer the member can read: what it should have been
  // ("an uncompressed event stream", ...), for 502 upstream_invalid_response
  // as unbatched; empty otherwise.
  std::string_view invalid_answer() const { return invalid_answer_; }

  // --- once wait_head() returned true ---
  std::string_view batch_id() const;  // the batch's upstream x-request-id
  // Members sent in the batch; of a coalesced generation, every member that
  // joined it so far (those that left included): read when the member's
  // log line is written, after the generation ended (no one joins then),
  // the final count, the same on every member's line.
  std::uint32_t batch_size() const;
  std::uint32_t slot() const { return slot_; }
  bool coalesced() const;  // a coalesced generation (pools.X.coalesce), not a prompt-list batch
  int endpoint() const;    // endpoint index in the pool
  std::chrono::steady_clock::time_point sent_at() const;  // the batch's request went upstream
  // The traceparent the batch's last attempt sent (its lead member's
  // Request::traceparent; empty: none): what a member's trace links its
  // upstream span to, when that was not its own (tracing:).
  std::string_view sent_traceparent() const;
  // The batch's attempts before its last one (retried: a connect failure,
  // a 429/5xx, a reset), in order, for the member's access-log line; and
  // the retries it made.
  struct EarlierAttempt {
    std::int16_t endpoint = -1;
    std::int16_t status = 0;  // 0: none (a failure)
    http::UpstreamFailure failure = http::UpstreamFailure::none;
    std::uint32_t us = 0;
    bool stale = false;  // a pooled connection the upstream had closed, resent free (RequestContext::AttemptRecord)
  };
  std::span<const EarlierAttempt> earlier_attempts() const;
  std::uint32_t batch_retries() const;
  // The batch's answer failed: true for the one member that counts the
  // failure against the endpoint (the first to ask), false for the others;
  // true outside a batch.
  bool counts_failure();

  // --- ResponseSource ---
  // A streaming member gets the upstream's head; a non-streaming one the
  // same with Content-Type application/json (its body is assembled from
  // its chunks); both get an upstream error answer (status >= 300, or not a
  // stream) as it came, body included.
  const http::ResponseHead& head() const override;
  bool done() const override { return ended_ && failure_ == http::UpstreamFailure::none && pos_ == out_.size(); }
  core::Task<http::BodyRead> read(std::span<char> into) override;
  // Leaves the batch (the others go on); a pending read completes with cancelled. After the batch was sent
  // (a prompt list some other member still reads), the member lingers: see lingering().
  void cancel() override;
  // The member left (cancel()) after its prompt went upstream in a list, where vLLM generates it to its end
  // all the same (it aborts a request, never one prompt of a list): it stays the batch's, reading nothing,
  // until its prompt ends upstream (its choice finished, or the batch ended or failed). settled() waits for
  // that; seen_usage() is then what the upstream generated for it. forget() leaves at once (its request
  // goes elsewhere, or its session ends).
  bool lingering() const { return lingering_; }
  core::Task<void> settled();
  void forget();
  // Once settled(): how the lingering ended -- none (its prompt finished), cancelled (every member left: the
  // batch was aborted upstream, its prompt with it, as the same request alone is when its client leaves), or
  // the batch's failure.
  http::UpstreamFailure linger_end() const { return linger_end_; }
  void cancel_stalled() override;
  bool stream_cut_short() const override { return cut_short_; }
  // The batch's last attempt failed (protocol) on a response head over http::kMaxResponseHead.
  bool head_too_large() const { return head_too_large_; }

  // The member's own usage as the batch's last chunk for it with a per-chunk usage said (the batch asks for
  // `continuous_usage_stats` on every member's behalf, whether or not its client did): its prompt's tokens
  // and its completion's so far, in tokens; also after it left. Of a batch of several, cached_tokens 0
  // (docs/batching.md, "Cached tokens"). nullopt when none came (a coalesced generation, which asks for no
  // per-chunk usage; an upstream that sends none) or it did not read as a usage object.
  std::optional<api::Usage> seen_usage() const;

 private:
  friend class Batch;
  friend class MicroBatcher;
  void begin(const Request& r);
  void push(std::string_view bytes);
  void end(http::UpstreamFailure f);

  Request req_;
  std::string key_;
  std::shared_ptr<Batch> batch_;
  core::Event ev_;
  std::string out_;  // demultiplexed bytes not read yet
  std::size_t pos_ = 0;
  bool head_ready_ = false;
  bool ended_ = false;
  bool lingering_ = false;  // lingering()
  http::UpstreamFailure linger_end_ = http::UpstreamFailure::none;
  int split_status_ = 0;
  bool withheld_ = false;
  bool cut_short_ = false;           // a non-streaming member's answer: the batch's stream ended before it was whole
  bool head_too_large_ = false;      // head_too_large()
  std::string_view invalid_answer_;  // a literal
  http::UpstreamFailure failure_ = http::UpstreamFailure::none;
  std::uint32_t slot_ = 0;
  std::string id_json_;                         // the member's response id, a JSON string
  std::string last_usage_;                      // its latest per-chunk usage object (seen_usage())
  api::openai::CompletionAssembler assembler_;  // non-streaming members
};

// What a batch takes from its worker, all of it on the worker's thread.
struct BatchEnv {
  core::Executor ex;
  const core::PoolConfig* pool_cfg = nullptr;
  routing::WorkerPool* pool = nullptr;
  routing::Rng* rng = nullptr;
  std::span<char> read_scratch;  // the worker's upstream receive buffer (http::Exchange)
  std::span<char> body_scratch;  // and its body buffer: used only between a read and its demultiplexing
  std::size_t max_response_bytes = 0;
  std::string_view upstream_lines;                    // the pool's header lines (core::PoolConfig::upstream_lines)
  std::function<void(std::string&)> next_request_id;  // the batch's own upstream request id
  Stats* stats = nullptr;
  std::uint64_t* upstream_connects = nullptr;  // the worker's new-connection counter
  // Each upstream attempt of a batch (connect tried, or request sent) on
  // endpoint `endpoint`, and how it failed (none: it got an answer; status:
  // a 5xx one); for the per-endpoint metrics. Called once per attempt, not
  // per member.
  std::function<void(std::uint32_t endpoint, http::UpstreamFailure f)> on_attempt;
  // A retry the batch made (weir_upstream_retries_total{reason}), once per batch.
  std::function<void(routing::RetryReason reason)> on_retry;
  // The batch's first endpoint pick, by the rule that made it (weir_routing_picks_total), once per batch.
  std::function<void(routing::PickRule rule)> on_pick;
};

class MicroBatcher {
 public:
  explicit MicroBatcher(BatchEnv env);
  ~MicroBatcher();
  const core::BatchConfig& config() const { return env_.pool_cfg->batch; }

  // Adds `m`, whose key() is set, to the open batch with the same key, or
  // opens one (its window starts now). A batch that reaches max_size leaves
  // at once. `r`'s views must stay valid until m.wait_head() returns.
  // Returns true when `m` opened the batch. `queue_place`: the member holds
  // a place in the pool's queue (pools.X.queue), which a batch it opens
  // takes, and gives back (PoolQueue::done) when its upstream request ends.
  bool join(BatchMember& m, const BatchMember::Request& r, bool queue_place = false);
  // Coalescing (pools.X.coalesce): `m`, whose key() is set by
  // api::openai::coalesce_key, shares the generation of an identical request
  // in flight (it first gets the events already relayed, then the rest), or
  // starts one at once (true; `queue_place` as for join). `r.body` is the
  // upstream body when it starts one.
  bool coalesce(BatchMember& m, const BatchMember::Request& r, bool queue_place = false);
  // Whether a member with `key` would join a batch open now (`coalesce`:
  // a coalesced generation in flight) rather than open one.
  bool joinable(std::string_view key, bool coalesce) const;
  // A drain: sends every open batch now, as if its window had ended, and
  // every batch opened from now on at the event loop's next turn (a window
  // of 0: the queue's waiters let out to join it in the same turn still
  // do): members are not kept waiting for a window that may end after the
  // drain's deadline (a body still arriving at the signal, a request let
  // out of the pool's queue, a pipelined one join later).
  void drain();
  // Open batches (collecting members), and coalesced generations in flight; for tests.
  std::size_t open_batches() const { return open_.size(); }
  std::size_t flights() const { return flights_.size(); }
  // No batch is open, in flight or still sending: the batcher may be
  // destroyed (a configuration reload retired its pool).
  bool idle() const { return open_.empty() && flights_.empty() && running_ == 0; }

 private:
  friend class Batch;
  void close(const Batch* b);  // no longer joinable: full, window over, empty, or (coalesced) done

  BatchEnv env_;
  std::vector<std::shared_ptr<Batch>> open_;
  std::vector<std::shared_ptr<Batch>> flights_;  // coalesced generations still joinable
  std::size_t running_ = 0;                      // batches whose upstream request runs (Batch::run)
  bool draining_ = false;                        // drain(): no more windows
};

}  // namespace weir::batching
