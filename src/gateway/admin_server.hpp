// The admin API's listener (docs/admin-api.md): HTTP/1.1 + JSON under
// /admin/v1/, plus /metrics and /ready, on the control io_context (the
// thread that runs JWKS refreshes and Redis syncs, never a worker's), so an
// admin request can not delay the request path. It reads worker state by
// posting to the workers and publishes key changes the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "core/async.hpp"
#include "core/time.hpp"
#include "gateway/admin_config.hpp"
#include "gateway/key_store.hpp"
#include "gateway/redis_key_admin.hpp"
#include "gateway/worker.hpp"
#include "http/io.hpp"
#include "http/shortage.hpp"
#include "requestlog/query.hpp"

namespace weir::gateway {

class Worker;

// One admin request, as a handler sees it.
struct AdminRequest {
  std::string method;
  std::string path;              // without the query
  std::string query;             // after '?', undecoded; empty when none
  std::string body;              // at most 1 MiB
  std::string if_none_match;     // the If-None-Match field (the console's files), empty when none
  std::string content_encoding;  // the Content-Encoding field(s), empty when none
  std::string content_type;      // the (first) Content-Type field, empty when none
  bool has_body = false;         // the head declares a body: chunked, or a Content-Length above 0
  bool authorized = false;       // answer_on_head() found the admin token valid (set there)
  // The authority the request names (gateway::request_authority: an absolute-form target's, else Host's
  // value), empty when none; checked against admin.allowed_hosts first.
  std::string authority;
  std::vector<std::string> params;  // the {name} segments of the route's pattern, in order
};

struct AdminResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::string cache_control = "no-store";
  // More fields (Location, ETag, Allow), in order.
  std::vector<std::pair<std::string, std::string>> headers;
};

using AdminHandler = std::function<core::Task<AdminResponse>(AdminRequest&)>;

// Routes by method and path pattern ("/admin/v1/keys/{id}/rotate": each
// {name} matches one non-empty segment). One line per route:
//   router.add("GET", "/admin/v1/keys/{id}", [this](AdminRequest& r) { return get_key(r); });
class AdminRouter {
 public:
  void add(std::string method, std::string pattern, AdminHandler handler);

  struct Match {
    const AdminHandler* handler = nullptr;  // null: see allow
    std::string allow;                      // methods of patterns that matched the path ("" = 404)
  };
  // The route for `method` and `path`; fills `params`. No handler and an
  // empty `allow`: 404; no handler and `allow` set: 405 with Allow: allow.
  Match match(std::string_view method, std::string_view path, std::vector<std::string>& params) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;  // "{...}" = a parameter
    AdminHandler handler;
  };
  std::vector<Route> routes_;
};

// Runs `fn` (a blocking call: a database query, a file scan) on `pool` and
// resumes the calling coroutine on its own executor with fn's result, so
// a handler on the control thread never blocks it:
//   auto rows = co_await run_blocking(blocking_pool, [q] { return store.query(q); });
// `fn` must not throw (catch inside and return an error value), and must be
// trivially copyable: it captures pointers or references to the caller's
// locals (they outlive the co_await), never owning values.
template <class F>
core::Task<std::invoke_result_t<F&>> run_blocking(boost::asio::thread_pool& pool, F fn) {
  // GCC 12 copies a coroutine's by-value parameters into its frame wrongly
  // when they own memory (a lambda capturing a std::string was freed twice):
  // capture pointers or references to the caller's locals, which outlive
  // the co_await, never owning values.
  static_assert(std::is_trivially_copyable_v<F>, "run_blocking: capture by pointer or reference only");
  using R = std::invoke_result_t<F&>;
  namespace asio = boost::asio;
  auto ex = co_await asio::this_coro::executor;
  auto token = core::use_task;
  auto [r] = co_await asio::async_initiate<decltype(token), void(R)>(
      [&pool, ex](auto handler, F f) {
        auto work = asio::prefer(ex, asio::execution::outstanding_work.tracked);
        asio::post(pool, [work, f = std::move(f), h = std::move(handler)]() mutable {
          R result = f();
          asio::post(work,
                     [h = std::move(h), result = std::move(result)]() mutable { std::move(h)(std::move(result)); });
        });
      },
      token, std::move(fn));
  co_return std::move(r);
}

class AdminServer {
 public:
  // `control`: the control io_context (must run while this serves).
  // `keys`: the runtime key store, null when auth is not configured (the
  // key routes then answer 409); with shared.redis_keys, runtime keys are
  // kept in Redis instead (RedisKeyAdmin) and `keys` serves the
  // configuration's. `shared` must be complete (workers listed).
  AdminServer(boost::asio::io_context& control, const AdminConfig& cfg, Shared& shared, KeyStore* keys);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // The hosts requests may name (admin.allowed_hosts, or its default for
  // the bound address), set by listen().
  const core::HostRule& host_rule() const { return host_rule_; }

  // Binds admin.listen with SO_REUSEPORT, as the client port's listeners
  // are, so that a new instance started with --reuse-port can share it for
  // a zero-downtime restart. `exclusive` (no --reuse-port): first refuse an
  // address another process already listens on (core::probe_listen_address),
  // as worker 0 does for the client port. Returns the bound port, or 0 with
  // `error` set.
  std::uint16_t listen(bool exclusive, std::string& error);
  void start();
  // The drain began. When another process shares the admin port (a new
  // instance joined it with --reuse-port: core::count_listeners), the
  // listener closes now, after taking the connections already waiting in
  // its queue (Linux resets them when a SO_REUSEPORT listener closes), so
  // new admin connections reach the instance that stays; alone on it, the
  // listener stays open until Weir exits (stop()), for /ready's 503 and
  // /metrics through the drain. Returns true when it closed: this instance
  // has handed over, and from then on answers a write (any method but GET
  // and HEAD) on a connection still open with 503 service_unavailable and
  // Connection: close, without applying it (the client retries it on a new
  // connection, which reaches the new instance); reads are still answered.
  bool drain();
  // Stops accepting (the workers are done) and watching keys_file. Open admin connections end with their
  // request.
  void stop();
  // A configuration reload installed `policy` (shared.auth_policy): keys in
  // Redis are checked against its tenants from now on.
  void reloaded(const std::shared_ptr<const auth::AuthPolicy>& policy) {
    if (redis_ && policy) redis_->set_base(policy);
  }

  // Whether `authorization` (the header's value) carries the admin token
  // (SHA-256 compared in constant time) or, with admin.jwt_claim, a JWT
  // that auth.jwt verifies and whose claim is the JSON boolean true (not
  // the string "true", nor 1). Empty error = ok; 503 (retry shortly) for a
  // JWT while no key set has been loaded yet. With `refetch_mark`, a JWT
  // whose kid the key set does not hold (or an empty set) also asks for a
  // refetch (JwksCache::fetch_for_unknown_kid, rate-limited by
  // auth.jwt.min_refetch_interval together with the client port's); when
  // one is in flight or was started, *refetch_mark is the
  // completed_fetches() mark to wait past (authorize() waits for it).
  tl::expected<void, AdminError> check_token(std::string_view authorization,
                                             std::optional<std::uint64_t>* refetch_mark = nullptr) const;
  // check_token(), and for a JWT signed with a key the cached set lacks (an
  // identity provider's new key) the refetch it started awaited (at most
  // 2 s, as on the client port; on the control thread, never a worker's)
  // and the token checked again: an admin JWT with a new kid works at once,
  // for jwks_url and jwks_file alike. `authorization` must outlive the await.
  core::Task<tl::expected<void, AdminError>> authorize(std::string_view authorization);
  // The first name=value pair's name in `query` (after '?', undecoded; "" for "=x"), none when it holds
  // no pair ("", "&&": as /admin/v1/requests reads them).
  static std::optional<std::string_view> first_query_parameter(std::string_view query);

 private:
  core::Task<void> accept_loop();
  // With admin.keys_file (and no auth.redis_keys): every kKeysFileCheck,
  // KeyStore::refresh(), and the policy published to the workers when it
  // changed, so a key another process sharing the file (a zero-downtime
  // restart's other instance) created, changed or revoked is in force here
  // within about that long. Until stop().
  core::Task<void> watch_keys_file();
  // Closes the listener; open connections end with their next answer.
  void close_listener();
  // One admin connection, HTTP/1.1 keep-alive (gateway/admin_serve.cpp):
  // each request's head checked (http/request_check.hpp: framing, Host,
  // target, Expect), then answer_on_head() before the body is read (unless
  // the body came whole with the head: it is read first, so the connection
  // stays open), "100 Continue" once a head that expects it passed, the
  // body within 1 MiB, the route's handler, the answer.
  core::Task<void> serve(http::Socket sock);
  // serve() on the control thread; an exception it lets out is logged, not rethrown.
  void spawn_serve(http::Socket sock);
  // One access-log line per admin request (the shared sink, when it is on):
  // {"ts", "listener":"admin", "method", "path" (no query), "client" (the
  // connection's peer address, null when unknown: server.trusted_proxies is
  // the client listener's), "status", "duration_ms", "bytes_in" (head and
  // body read), "bytes_out" (head and body written)}; never
  // a credential. A `scrape` (a /metrics answered 200) is not logged.
  void log_request(std::string_view method, std::string_view path, std::string_view client, int status,
                   core::TimePoint t0, std::size_t bytes_in, std::size_t bytes_out, bool scrape = false) const;
  // What answers `req` on its head alone, checked in this order whether or
  // not the head expects 100-continue or its body came with it (so both
  // get the same answer): a host admin.allowed_hosts does not allow (421
  // host_not_allowed, RFC 9110 §15.5.20); more than one Authorization field (400); a method
  // no resource has (501); `/` and the console's files (their answer: they
  // need no token); a missing or wrong admin token (401; authorize()) on
  // any path but /metrics and /ready; a Content-Encoding (415); an unknown
  // path (404) or a method the path does not take (405). nullopt: the
  // route's handler answers, `handler` set and req.params filled. serve()
  // asks before "Expect: 100-continue" is answered (RFC 9110 §10.1.1: a
  // refused request gets its final answer instead of 100 Continue).
  // `authorization` (the first field's value) must outlive the await.
  core::Task<std::optional<AdminResponse>> answer_on_head(AdminRequest& req, std::string_view authorization,
                                                          std::size_t authorization_fields,
                                                          const AdminHandler*& handler);
  // Makes `policy` the control thread's (shared.auth_policy, the base of keys
  // in Redis) and sends it to every worker (each swaps its Authenticator's
  // policy on its own thread); returns once all did, or after 2 s: the
  // number of workers that had not yet (0 = in force everywhere).
  core::Task<std::size_t> publish(std::shared_ptr<const auth::AuthPolicy> policy);
  // Drops every worker's cached Redis key lookups (Authenticator::forget_redis_keys)
  // and waits (at most 2 s) until each has: a key changed here takes effect here before the answer.
  // Returns the number of workers that had not yet.
  core::Task<std::size_t> forget_redis_keys();
  // Posts `fn` to every worker's thread; the returned gathering's timer is
  // cancelled once each has run it and expires after 2 s (co_await
  // wait_for_workers: the workers that have not run it by then). A plain
  // function, not a coroutine: GCC 12 mishandles a std::function (or a
  // temporary one) handed to a coroutine.
  struct WorkerGather;
  std::shared_ptr<WorkerGather> post_to_every_worker(std::function<void(Worker&)> fn);
  core::Task<std::size_t> wait_for_workers(std::shared_ptr<WorkerGather> g);
  // A key change's answer: `status` with `o` when every worker has it
  // (`pending` = 0); otherwise 202 with `o` and "pending_workers": pending
  // (saved, not yet in force on that many workers; docs/admin-api.md).
  static AdminResponse applied_response(int status, boost::json::object& o, std::size_t pending);

  // A route that takes no query parameter was given one: 400 invalid_request_error naming it (param).
  core::Task<AdminResponse> query_refused(AdminRequest& r);
  // A route that reads no body (every one but POST /admin/v1/keys and PATCH /admin/v1/keys/{id}) was sent
  // one other than nothing, whitespace or {}: 400 invalid_request_error, as parse_object says it (not JSON,
  // a repeated member) or naming its first member (param), before anything changes.
  static std::optional<AdminError> unread_body_error(const AdminRequest& r);
  core::Task<AdminResponse> body_refused(AdminRequest& r);
  core::Task<AdminResponse> list_keys(AdminRequest& r);
  core::Task<AdminResponse> create_key(AdminRequest& r);
  core::Task<AdminResponse> get_key(AdminRequest& r);
  core::Task<AdminResponse> update_key(AdminRequest& r);
  core::Task<AdminResponse> delete_key(AdminRequest& r);
  core::Task<AdminResponse> rotate_key(AdminRequest& r);
  core::Task<AdminResponse> list_tenants(AdminRequest& r);
  core::Task<AdminResponse> get_tenant(AdminRequest& r);
  core::Task<AdminResponse> metrics(AdminRequest& r);
  core::Task<AdminResponse> ready(AdminRequest& r);
  // GET /admin/v1/requests?since=&until=&tenant=&key_id=&model=&status=&limit=&cursor=
  // and GET /admin/v1/requests/{request_id}: the request-log store
  // (requestlog::Reader, queried on the blocking pool); 404 without request_log:.
  core::Task<AdminResponse> list_requests(AdminRequest& r);
  core::Task<AdminResponse> get_request(AdminRequest& r);
  // GET /admin/v1/stats: traffic by model and tenant since start (MetricsShard::stats_json).
  core::Task<AdminResponse> stats(AdminRequest& r);
  // GET /admin/v1/pools: every pool and endpoint with its health, in-flight
  // requests, idle connections, scraped load, attempts and failures,
  // gathered from every worker.
  core::Task<AdminResponse> pools(AdminRequest& r);
  // The web console's files (docs/console.md): "/" redirects to /console/,
  // /console/... answers from console::assets() with an ETag (304 when
  // If-None-Match matches). No token: they hold no data; the console asks
  // for the token and sends it with every API call. A method other than
  // GET or HEAD on them is a 405 (Allow: GET, HEAD). Null for other paths.
  std::optional<AdminResponse> console_file(const AdminRequest& r) const;

  boost::json::object usage_json(std::uint32_t scope, const auth::Limits& l, const auth::Budget& b) const;
  // `runtime_keys`: runtime_keys_by_tenant()'s counts; its error (Redis cannot be read) makes the answer's
  // runtime_keys null, with runtime_keys_error saying why: the rest needs no Redis.
  boost::json::object tenant_json(const auth::TenantPolicy& t,
                                  const AdminResult<std::unordered_map<std::string, std::size_t>>& runtime_keys) const;
  // Runtime keys per tenant name: the local store's, or with auth.redis_keys those in Redis (an
  // AdminError, 503 key_store_unavailable, when it cannot be read).
  core::Task<AdminResult<std::unordered_map<std::string, std::size_t>>> runtime_keys_by_tenant();
  boost::json::object config_key_json(const auth::KeyPolicy& k) const;

  boost::asio::io_context& control_;
  // The request log's read side (its own read-only connection), or null without request_log:.
  std::unique_ptr<requestlog::Reader> requests_;
  AdminConfig cfg_;
  core::HostRule host_rule_;  // effective_host_rule() for the bound address (listen())
  Shared& shared_;
  KeyStore* keys_;
  // With auth.redis_keys: runtime keys live in Redis (every replica sees them), not in keys_.
  std::unique_ptr<RedisKeyAdmin> redis_;
  http::Acceptor acceptor_;
  // accept(2) failing (out of descriptors): told on stderr at a bounded rate.
  http::ShortageLog accept_log_{"admin: cannot accept connections on admin.listen",
                                "new admin connections wait in the listen backlog until descriptors are free "
                                "(weir_accept_errors_total)"};
  AdminRouter router_;
  // For routes that must block (run_blocking): one thread, off the control thread and the workers.
  boost::asio::thread_pool blocking_{1};
  std::uint32_t initial_scopes_ = 0;  // scopes a limiter that does not grow holds
  bool stopped_ = false;
  // Connections being served (spawn_serve counts one in, serve() out; shared with their frames, which may
  // outlive this at exit). At cfg_.max_connections the oldest that has not presented the admin token is
  // closed to make room (so connections anyone can open cannot lock the operator out), or, when every one
  // has, the new one.
  struct ConnectionTable {
    std::size_t count = 0;
    // The sockets of connections no request of which presented the admin token, oldest first; nullptr: one
    // closed to make room (its serve() removes its entry as it ends).
    std::list<http::Socket*> untrusted;
  };
  std::shared_ptr<ConnectionTable> connections_ = std::make_shared<ConnectionTable>();
  bool handed_over_ = false;  // drain() closed the listener: another instance serves the admin API
  bool watching_ = false;     // watch_keys_file() runs
  core::Timer keys_watch_;
};

}  // namespace weir::gateway
