// Weir's own endpoints: GET /v1/models and /metrics.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "auth/policy.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "http/io.hpp"

#include <boost/asio/io_context.hpp>

namespace weir::gateway {

class MetricsShard;
class Worker;
struct Shared;
struct MetricLabels;
struct Generation;

// One page of Anthropic's model list, as its List Models API takes it from
// the query (API reference, "List Models"): `limit` models (1..1000,
// default 20) from the start of the list, or right after the model
// `after_id` names, or right before the one `before_id` names.
struct AnthropicPage {
  std::size_t limit = 20;
  std::string after_id;   // empty: not given
  std::string before_id;  // empty: not given
};

// The page `query` (a request target's query, without '?', undecoded:
// "limit=5&after_id=m") asks for; other parameters are ignored. Values are
// percent-decoded ('+' is a space). Errors, 400 invalid_request_error naming
// the parameter: a limit that is not an integer in 1..1000, an empty
// after_id or before_id, one given twice, both cursors at once, an invalid
// percent escape.
tl::expected<AnthropicPage, core::Error> anthropic_page(std::string_view query);

// GET /v1/models → OpenAI's list object {"object":"list","data":[{id, object:"model",
// created, owned_by, root (the canonical name), max_model_len (only when
// models.NAME.max_model_len is set: vLLM's field)}]} with every configured model and alias that `principal`
// may use (all of them when it is null); GET /v1/models/{id} → that model
// object, or 404 model_not_found (also for a model the principal may not use).
// `anthropic` (the request carried anthropic-version: an Anthropic SDK's
// models.list()/retrieve()): Anthropic's shapes instead (API reference,
// "Models"): {"data":[{"type":"model","id","display_name","created_at":
// RFC 3339}],"has_more","first_id","last_id"}, one page of the list as
// `query` (the target's, without '?') asks (anthropic_page(); its errors,
// and 400 for a cursor that names no model the principal may use), and that
// model object.
tl::expected<std::string, core::Error> models_response(const core::Config& cfg, std::string_view path,
                                                       const auth::Principal* principal, bool anthropic = false,
                                                       std::string_view query = {});

// The upstream's model list (GET /v1/models to the default pool, when the
// configuration has no `models:` section: the upstream knows its models),
// as the client asked for it: the list with only the models `principal`
// may use (all when it is null), or for GET /v1/models/{id} (`path`) that
// model's object, or 404 model_not_found (vLLM has no such route; a model
// the principal may not use is not found either). Returns "" when
// `upstream_list` is no OpenAI list object (passed on as it came).
// `anthropic`: in Anthropic's shapes, as models_response (created_at from
// each model's `created`; one page as `query` asks).
tl::expected<std::string, core::Error> upstream_models_response(std::string_view upstream_list, std::string_view path,
                                                                const auth::Principal* principal,
                                                                bool anthropic = false, std::string_view query = {});

// Why GET /ready answers 503 now, empty while ready (docs/reliability.md#readiness):
// "Weir is draining.", or with server.ready_pools `all` the pools that have
// no endpoint available on any worker (every one ejected: refused, failing,
// probe-down or breaker open; a half-open one is available), with `any`
// every pool when none has one. Only pools a model routes to (or the
// default pool) count: a pool only a fallback names is a spare. Reads
// generation `gen`'s pools' health boards (atomics): any thread, with the
// caller's generation (a worker's, or the control thread's). `draining`:
// Shared::draining.
std::string ready_problem(const Generation& gen, bool draining);

// Collects every worker's metrics shard (posting to each; no locks) and
// returns them merged, on `labels` (the caller's generation's; a worker on
// later ones brings its own along). Waits at most one second for the other
// workers. `labels` must outlive the call.
http::Task<std::shared_ptr<MetricsShard>> collect_metrics(Shared& shared, boost::asio::io_context& home,
                                                          const std::shared_ptr<const MetricLabels>& labels);

// Collects every worker's metrics shard (posting to each; no locks) and
// renders the merged set in Prometheus text format into `out`. Waits at most
// one second for the other workers.
http::Task<void> collect_metrics_text(Worker& self, std::string& out);
// The same from any thread with an io_context of its own (`home`: the
// caller's, e.g. the control thread's for the admin listener), given the
// workers' `shared` state.
// `gen` and `policy` (null without auth) are the caller's view of the
// configuration (a worker's generation, or the control thread's) and must
// outlive the call: its labels, and its pools' health boards and loads
// (weir_upstream_endpoint_state, weir_upstream_available_endpoints, weir_pool_saturated).
http::Task<void> collect_metrics_text(Shared& shared, boost::asio::io_context& home, std::string& out,
                                      const std::shared_ptr<const Generation>& gen,
                                      const std::shared_ptr<const auth::AuthPolicy>& policy);

}  // namespace weir::gateway
