// The read phase: what the head names (route, method, request id), the
// routes and methods Weir serves, and the body within limits.
#include <boost/beast/http/verb.hpp>

#include "core/json_text.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

core::Task<Outcome> GatewayPhases::read(RequestContext& ctx) {
  ctx.model_slot = w_.metrics().no_model();
  if (ctx.read_failure != http::ReadFailure::none) {
    // The head is unusable: never an empty id in the log or the reply.
    ctx.method = "-";
    w_.next_request_id(ctx.request_id);
    co_return Outcome::failed(read_error(ctx.read_failure, w_.config().server, down_.failure_detail()));
  }
  const auto& req = down_.request();
  const std::string_view path = path_of(req.target());
  ctx.route = classify_path(path);
  ctx.method.assign(req.method_string());
  ctx.path.assign(core::utf8_prefix(path, core::kMaxEchoBytes));
  if (auto id = req["x-request-id"]; valid_request_id(id))
    ctx.request_id.assign(id);
  else
    w_.next_request_id(ctx.request_id);
  if (w_.tracer() && traced(ctx.route)) begin_trace(ctx);

  // Unknown routes and wrong methods are answered without reading the body:
  // the connection then closes unless there was none.
  if (ctx.route == RouteKind::other) {
    if (!down_.body_complete()) down_.no_keep_alive();
    co_return Outcome::failed(core::not_found(path));
  }
  const bool post_route = api_of(ctx.route).has_value();
  const bool get_or_head = req.method() == bh::verb::get || req.method() == bh::verb::head;
  if ((post_route && req.method() != bh::verb::post) || (!post_route && !get_or_head)) {
    if (!down_.body_complete()) down_.no_keep_alive();
    co_return Outcome::failed(core::method_not_allowed(req.method_string(), path));
  }
  if (!down_.body_complete()) {
    if (!down_.has_body_storage()) down_.lend_body_storage(w_.take_buffer());
    if (!co_await down_.read_body())
      co_return Outcome::failed(read_error(down_.failure(), w_.config().server, down_.failure_detail()));
  }
  ctx.bytes_in = down_.body().size();
  w_.metrics().bytes_in += ctx.bytes_in;
  co_return Outcome::next();
}

}  // namespace weir::gateway
