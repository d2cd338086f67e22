#include "gateway/admin_server.hpp"

#include <openssl/crypto.h>
#include <sys/socket.h>

#include <cerrno>

#include <array>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "auth/authenticator.hpp"
#include "auth/jwks_wait.hpp"
#include "auth/jwt.hpp"
#include "core/calendar.hpp"
#include "core/json_text.hpp"
#include "core/keep_running.hpp"
#include "core/listen_probe.hpp"
#include "core/note.hpp"
#include "core/text.hpp"
#include "gateway/admin.hpp"
#include "gateway/admin_handlers.hpp"
#include "gateway/console_assets.hpp"
#include "gateway/metrics.hpp"
#include "http/request_check.hpp"
#include "requestlog/store.hpp"

namespace weir::gateway {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bh = boost::beast::http;
namespace json = boost::json;
using namespace admin_detail;

namespace {

// How often keys_file is checked for another process's changes (a stat(2); read only when it changed): the
// bound on how long a key revoked by the other instance of a zero-downtime restart still works here.
constexpr auto kKeysFileCheck = std::chrono::seconds(1);

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> out;
  while (!path.empty()) {
    if (path.front() == '/') {
      path.remove_prefix(1);
      continue;
    }
    const auto slash = path.find('/');
    out.emplace_back(path.substr(0, slash));
    path = slash == std::string_view::npos ? std::string_view() : path.substr(slash);
  }
  return out;
}

// A path segment with its %XX escapes decoded (RFC 3986 §2.1), so an id
// holding '/', '?' or '%' can be named (the console encodes with
// encodeURIComponent). A '%' not followed by two hex digits stays as it is.
std::string percent_decode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// A request-log error (core::Error: 400 with its param, 503) in the admin API's shape.
AdminResponse store_error(const core::Error& e) {
  return error_response(
      AdminError{e.status, std::string(e.type), std::string(e.code), e.message, std::string(e.param)});
}

AdminError no_request_log() {
  return AdminError{
      404,
      "invalid_request_error",
      "no_request_log",
      "The request log is off: configure request_log: {url: \"sqlite:PATH\"} (or postgres://...) to store and "
      "query requests.",
      {}};
}

// application/json or application/*+json (RFC 6839), any case, parameters (charset) after ';' aside; an
// empty or absent type is not one.
bool json_media_type(std::string_view content_type) {
  const std::string_view type = core::trim_ows(content_type.substr(0, content_type.find(';')));
  constexpr std::string_view kApp = "application/";
  if (type.size() <= kApp.size() || !core::iequals(type.substr(0, kApp.size()), kApp)) return false;
  const std::string_view sub = type.substr(kApp.size());
  return core::iequals(sub, "json") || (sub.size() > 5 && core::iequals(sub.substr(sub.size() - 5), "+json"));
}

AdminError unauthorized(std::string message) {
  return AdminError{401, "invalid_request_error", "invalid_api_key", std::move(message), {}};
}

}  // namespace

// ---------------------------------------------------------------- AdminRouter

void AdminRouter::add(std::string method, std::string pattern, AdminHandler handler) {
  routes_.push_back(Route{std::move(method), split_path(pattern), std::move(handler)});
}

AdminRouter::Match AdminRouter::match(std::string_view method, std::string_view path,
                                      std::vector<std::string>& params) const {
  Match m;
  // Only a route's own spelling matches: no empty segment, no trailing '/'.
  // ("//metrics" was /metrics to the router but not to the token check and
  // the log's scrape exemption, which read the path as written.)
  if (path.find("//") != std::string_view::npos || (path.size() > 1 && path.back() == '/')) return m;
  const auto segs = split_path(path);
  for (const auto& r : routes_) {
    if (r.segments.size() != segs.size()) continue;
    std::vector<std::string> got;
    bool ok = true;
    for (std::size_t i = 0; i < segs.size() && ok; ++i) {
      const auto& s = r.segments[i];
      if (s.size() > 2 && s.front() == '{' && s.back() == '}')
        got.push_back(percent_decode(segs[i]));
      else
        ok = s == segs[i];
    }
    if (!ok) continue;
    if (r.method == method || (method == "HEAD" && r.method == "GET")) {
      params = std::move(got);
      m.handler = &r.handler;
      return m;
    }
    if (m.allow.find(r.method) == std::string::npos) m.allow += (m.allow.empty() ? "" : ", ") + r.method;
    // A GET route answers HEAD too (above): Allow lists it (RFC 9110 §15.5.6).
    if (r.method == "GET" && m.allow.find("HEAD") == std::string::npos) m.allow += ", HEAD";
  }
  return m;
}

// ---------------------------------------------------------------- AdminServer

AdminServer::AdminServer(boost::asio::io_context& control, const AdminConfig& cfg, Shared& shared, KeyStore* keys)
    : control_(control),
      cfg_(cfg),
      shared_(shared),
      keys_(keys),
      acceptor_(control.get_executor()),
      keys_watch_(control.get_executor()) {
  if (shared_.auth_policy) initial_scopes_ = static_cast<std::uint32_t>(shared_.auth_policy->scopes().size());
  if (shared_.redis_keys && shared_.auth_policy)
    redis_ = std::make_unique<RedisKeyAdmin>(*shared_.redis_keys, shared_.auth_policy);
  // A route takes no query parameter unless it says so (`query`): one it would ignore is a 400, as
  // /admin/v1/requests' unknown ones are ("?tenant=acme" on /admin/v1/keys is no filter: a script that
  // revoked what it listed would revoke every tenant's keys). /metrics and /ready take any (a
  // Prometheus job's params:, a prober's own). Nor does a route take a body unless it says so (`body`): a
  // DELETE sent {"dry_run": true} is refused, not carried out (unread_body_error).
  enum Takes : unsigned { nothing = 0, query = 1, body = 2 };
  auto route = [this](const char* method, const char* pattern,
                      core::Task<AdminResponse> (AdminServer::*fn)(AdminRequest&), unsigned takes = nothing) {
    router_.add(method, pattern, [this, fn, takes](AdminRequest& r) {
      if (!(takes & query) && first_query_parameter(r.query)) return query_refused(r);
      if (!(takes & body) && unread_body_error(r)) return body_refused(r);
      return (this->*fn)(r);
    });
  };
  route("GET", "/admin/v1/keys", &AdminServer::list_keys);
  route("POST", "/admin/v1/keys", &AdminServer::create_key, body);
  route("GET", "/admin/v1/keys/{id}", &AdminServer::get_key);
  route("PATCH", "/admin/v1/keys/{id}", &AdminServer::update_key, body);
  route("DELETE", "/admin/v1/keys/{id}", &AdminServer::delete_key);
  route("POST", "/admin/v1/keys/{id}/rotate", &AdminServer::rotate_key);
  route("GET", "/admin/v1/tenants", &AdminServer::list_tenants);
  route("GET", "/admin/v1/tenants/{name}", &AdminServer::get_tenant);
  route("GET", "/admin/v1/requests", &AdminServer::list_requests, query);
  route("GET", "/admin/v1/requests/{id}", &AdminServer::get_request);
  route("GET", "/admin/v1/stats", &AdminServer::stats);
  route("GET", "/admin/v1/pools", &AdminServer::pools);
  route("GET", "/metrics", &AdminServer::metrics, query);
  route("GET", "/ready", &AdminServer::ready, query);
  if (shared_.request_log) requests_ = std::make_unique<requestlog::Reader>(shared_.request_log->config());
}

AdminServer::~AdminServer() { blocking_.join(); }

std::uint16_t AdminServer::listen(bool exclusive, std::string& error) {
  boost::system::error_code ec;
  auto ip = core::resolve_listen_host(cfg_.listen.host);
  if (!ip) {
    error = "admin.listen: " + ip.error();
    return 0;
  }
  const http::tcp::endpoint ep(*ip, cfg_.listen.port);
  if (exclusive && core::probe_listen_address(ep) == EADDRINUSE) {
    error = fmt::format(
        "admin.listen: {} is already in use by another process (give --reuse-port or server.reuse_port: true to "
        "share it on purpose, e.g. for a zero-downtime restart)",
        core::format_address(ep));
    return 0;
  }
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) {
    // Without it a second instance could not bind the admin port while this one drains (the client port's
    // listeners have it too: Worker::listen).
    int one = 1;
    if (::setsockopt(acceptor_.native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
      ec = boost::system::error_code(errno, boost::system::system_category());
  }
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(128, ec);
  if (ec) {
    error = fmt::format("admin.listen: cannot listen on {}: {}",
                        core::format_host_port(cfg_.listen.host, cfg_.listen.port), ec.message());
    return 0;
  }
  const auto bound = acceptor_.local_endpoint();
  host_rule_ = effective_host_rule(cfg_.allowed_hosts ? &*cfg_.allowed_hosts : nullptr, bound.address());
  return bound.port();
}

void AdminServer::start() {
  asio::co_spawn(control_.get_executor(), accept_loop(), asio::detached);
  if (keys_ && keys_->persistent() && !redis_) {
    watching_ = true;
    asio::co_spawn(control_.get_executor(),
                   core::keep_running("the admin.keys_file watcher", [this] { return watch_keys_file(); }),
                   asio::detached);
  }
}

core::Task<void> AdminServer::watch_keys_file() {
  while (watching_) {
    keys_watch_.expires_after(kKeysFileCheck);
    co_await keys_watch_.async_wait(core::use_task);
    if (!watching_) co_return;  // (stop() cancelled the wait)
    const auto version = keys_->version();
    auto changed = keys_->refresh();
    if (!changed) {
      weir::core::note("weir: {}; the runtime keys stay as they were (read again once the file changes)\n",
                       changed.error());
      continue;
    }
    if (*changed)
      weir::core::note(
          "weir: admin.keys_file {} changed on disk (another Weir sharing it, or an edit): read again, {} "
          "runtime key{}\n",
          cfg_.keys_file, keys_->keys().size(), keys_->keys().size() == 1 ? "" : "s");
    // It held keys revoked here (an older Weir wrote it from its memory): refused here still; written again
    // without them, so that no later reader (a restart) admits them.
    if (auto repaired = keys_->repair(); !repaired)
      weir::core::note("weir: admin.keys_file {}: keys revoked here are still in it: {}\n", cfg_.keys_file,
                       repaired.error());
    else if (*repaired)
      weir::core::note(
          "weir: admin.keys_file {} held keys revoked here (written by an older Weir): written again "
          "without them\n",
          cfg_.keys_file);
    if (keys_->version() != version) co_await publish(keys_->policy());
  }
}

bool AdminServer::drain() {
  boost::system::error_code ec;
  if (!acceptor_.is_open()) return false;
  const auto ep = acceptor_.local_endpoint(ec);
  if (ec || core::count_listeners(ep) < 2) return false;
  // Taken first, each is served on (its client already sent a request the other instance cannot see).
  acceptor_.non_blocking(true, ec);
  for (int n = 0; n < 128; ++n) {
    auto sock = acceptor_.accept(ec);
    if (ec) break;
    spawn_serve(std::move(sock));
  }
  close_listener();
  handed_over_ = true;
  return true;
}

void AdminServer::close_listener() {
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

void AdminServer::stop() {
  close_listener();
  watching_ = false;
  keys_watch_.cancel();
}

core::Task<void> AdminServer::accept_loop() {
  for (;;) {
    auto [ec, sock] = co_await acceptor_.async_accept(core::use_task);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      // Out of descriptors or memory: as on the client port (Worker::accept_loop).
      http::count_shortage(http::ShortageSite::admin_accept, http::shortage_of(ec));
      accept_log_.failed(ec, std::chrono::steady_clock::now());
      core::Timer t(control_.get_executor());
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(core::use_task);
      continue;
    }
    if (accept_log_.failing()) accept_log_.succeeded(std::chrono::steady_clock::now());
    spawn_serve(std::move(sock));
  }
}

void AdminServer::spawn_serve(http::Socket sock) {
  // At admin.max_connections (so connections nobody authenticated cannot take the descriptors the client
  // port needs): the oldest connection that has not presented the admin token is closed to make room, so
  // connections anyone can open (idle, or sending a head slowly) cannot keep the operator out; when every
  // one has presented it, the new one is closed at once (the client sees the connection end, and retries).
  if (connections_->count >= cfg_.max_connections) {
    boost::system::error_code ignored;
    auto& untrusted = connections_->untrusted;
    const auto oldest = std::find_if(untrusted.begin(), untrusted.end(), [](auto* s) { return s != nullptr; });
    if (oldest == untrusted.end()) {
      sock.close(ignored);
      return;
    }
    (*oldest)->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    (*oldest)->close(ignored);  // (its pending read ends: its serve() returns, and counts itself out)
    *oldest = nullptr;
  }
  ++connections_->count;
  asio::co_spawn(control_.get_executor(), serve(std::move(sock)), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      weir::core::note("weir: admin: connection failed: {}\n", ex.what());
    }
  });
}

tl::expected<void, AdminError> AdminServer::check_token(std::string_view authorization,
                                                        std::optional<std::uint64_t>* refetch_mark) const {
  authorization = core::trim_ows(authorization);
  const auto bearer = auth::bearer_token(authorization);
  if (!authorization.empty() && !bearer)
    return tl::unexpected(unauthorized("The Authorization header must use the Bearer scheme."));
  // The scheme alone ("Bearer", "bearer   ") presents no token: no credential, as an absent header (and as on
  // the client port), never hashed and compared (the empty string's SHA-256 is no admin token's).
  if (!bearer || bearer->empty())
    return tl::unexpected(
        unauthorized("You didn't provide an admin token. Pass it in an Authorization header using Bearer auth "
                     "(Authorization: Bearer ADMIN_TOKEN)."));
  const std::string_view token = *bearer;
  if (cfg_.has_token) {
    const auth::Sha256Digest d = auth::sha256(token);
    if (CRYPTO_memcmp(d.data(), cfg_.token_sha256.data(), d.size()) == 0) return {};
  }
  if (!cfg_.jwt_claim.empty() && shared_.jwks && shared_.auth_policy && shared_.auth_policy->config().jwt &&
      auth::looks_like_jwt(token)) {
    const auto& j = *shared_.auth_policy->config().jwt;
    auth::ClaimsPolicy claims;
    claims.issuer = j.issuer;
    claims.audiences = j.audiences;
    claims.leeway = j.leeway;
    claims.require_exp = j.require_exp;
    // None loaded yet (the first fetch failed or has not answered; the cache holds an empty placeholder, never
    // null): as on the client port, 503 to retry shortly, after waiting for the fetch in flight if there is one.
    if (shared_.jwks->stats().updates == 0) {
      if (refetch_mark) *refetch_mark = shared_.jwks->fetch_for_unknown_kid();
      return tl::unexpected(AdminError{
          503, "server_error", "service_unavailable", "Signing keys are not loaded yet; retry shortly.", {}});
    }
    const auto keys = shared_.jwks->keys();
    const auto now = std::chrono::system_clock::now();
    auto v = auth::verify_jwt(token, *keys, claims, now);
    if (!v) {
      // A kid the set does not hold (the identity provider's new key): ask for the refetch the client
      // port asks for (Authenticator::authenticate_jwt), under the same rate limit.
      if (const auto kind = v.error().kind;
          refetch_mark && (kind == auth::JwtFailure::unknown_kid || kind == auth::JwtFailure::no_keys)) {
        *refetch_mark = shared_.jwks->fetch_for_unknown_kid();
      }
      return tl::unexpected(unauthorized("Invalid bearer token: " + v.error().message + "."));
    }
    // (As the client port reads its claims: auth::find_claim: nested first, then a namespaced name.)
    const json::value* c = auth::find_claim(v->claims, cfg_.jwt_claim);
    // Only the JSON boolean true: identity providers often map user attributes to strings, and a
    // string "true" an ordinary user can set must not grant admin.
    if (c && c->is_bool() && c->get_bool()) return {};
    return tl::unexpected(unauthorized(fmt::format("The token's '{}' claim does not grant admin.", cfg_.jwt_claim)));
  }
  return tl::unexpected(unauthorized("Incorrect admin token provided."));
}

core::Task<tl::expected<void, AdminError>> AdminServer::authorize(std::string_view authorization) {
  std::optional<std::uint64_t> mark;
  auto ok = check_token(authorization, &mark);
  if (ok || !mark) co_return ok;
  // The refetch this token started: wait for it (at most 2 s, as a client request does; on the control
  // thread, which runs the fetch too, so no worker waits), then check once more.
  co_await auth::async_wait_fetch(*shared_.jwks, *mark, std::chrono::seconds(2), control_.get_executor(),
                                  core::use_task);
  co_return check_token(authorization);
}

core::Task<std::optional<AdminResponse>> AdminServer::answer_on_head(AdminRequest& req, std::string_view authorization,
                                                                     std::size_t authorization_fields,
                                                                     const AdminHandler*& handler) {
  handler = nullptr;
  // First of all: a request for a host this listener does not serve gets
  // nothing of it, the console's files and the answers without a token
  // included (a DNS-rebinding page reads those: host_rule.hpp). 421, not
  // 403: RFC 9110 §15.5.20 names it for "a target URI that does not match an
  // origin for which the server has been configured", which this is; the
  // request is not forbidden to its sender, it reached the wrong server.
  if (!host_allowed(host_rule_, req.authority))
    co_return error_response(AdminError{
        421,
        "invalid_request_error",
        "host_not_allowed",
        fmt::format("The admin listener does not serve {} (admin.allowed_hosts{}).",
                    req.authority.empty() ? std::string("a request without a host name (no Host, or an empty one)")
                                          : fmt::format("the host '{}'", core::utf8_prefix(req.authority, 256)),
                    host_rule_.kind == core::HostRule::Kind::local
                        ? "; on a loopback address it answers IP literals and localhost unless the option lists more"
                        : ""),
        {}});
  // A singleton field (RFC 9110 §11.6.2): one credential.
  if (authorization_fields > 1)
    co_return error_response(
        admin_bad_request("The request has more than one Authorization header; send one credential."));
  // A method no resource has: 501, not 405 (RFC 9110 §9.1), before the credential, as on the client listener.
  if (bh::string_to_verb(req.method) == bh::verb::unknown)
    co_return error_response(AdminError{
        501,
        "invalid_request_error",
        "method_not_implemented",
        fmt::format("Method {} is not implemented (methods are case-sensitive).", core::utf8_prefix(req.method, 16)),
        {}});
  if (auto file = console_file(req)) co_return std::move(file);
  // /metrics and /ready answer as on the client port (no secret in them); everything else needs the token.
  if (req.path != "/metrics" && req.path != "/ready") {
    auto ok = co_await authorize(authorization);
    if (!ok) {
      AdminResponse r = error_response(ok.error());
      if (ok.error().status == 503) r.headers.emplace_back("Retry-After", "1");  // (no signing keys yet)
      co_return r;
    }
    req.authorized = true;
  }
  // The admin API's bodies are JSON as sent: a coded one is not read as if it were not (RFC 9110 §15.5.16).
  if (!req.content_encoding.empty() && !core::iequals(req.content_encoding, "identity")) {
    auto r = error_response(AdminError{415,
                                       "invalid_request_error",
                                       "unsupported_content_encoding",
                                       "The admin API takes request bodies without a Content-Encoding.",
                                       {}});
    r.headers.emplace_back("Accept-Encoding", "identity");
    co_return r;
  }
  auto m = router_.match(req.method, req.path, req.params);
  if (!m.handler) {
    if (!m.allow.empty())
      co_return error_response(AdminError{405,
                                          "invalid_request_error",
                                          "method_not_allowed",
                                          fmt::format("Method {} is not allowed on {} (allowed: {}).",
                                                      req.method.substr(0, 16), req.path.substr(0, 256), m.allow),
                                          {}});
    co_return error_response(AdminError{404,
                                        "invalid_request_error",
                                        "unknown_url",
                                        fmt::format("Unknown admin path: {}.", req.path.substr(0, 256)),
                                        {}});
  }
  // A body is JSON, said so (application/json, or application/*+json: RFC 6839), as the client port asks
  // of one (415 there too): a form or text/plain one, which a page elsewhere could send as a "simple"
  // cross-origin request (no preflight), is refused unread, and so is one that names no type.
  if (req.has_body && !json_media_type(req.content_type)) {
    co_return error_response(
        AdminError{415,
                   "invalid_request_error",
                   "unsupported_media_type",
                   fmt::format("The admin API's request bodies are JSON: send Content-Type: application/json ({}).",
                               req.content_type.empty()
                                   ? std::string("the request has none")
                                   : fmt::format("not '{}'", core::utf8_prefix(core::trim_ows(req.content_type), 64))),
                   {}});
  }
  handler = m.handler;
  co_return std::nullopt;
}

struct AdminServer::WorkerGather {
  WorkerGather(core::Executor ex, std::size_t n) : remaining(n), timer(ex) {}
  std::size_t remaining;
  core::Timer timer;
};

std::shared_ptr<AdminServer::WorkerGather> AdminServer::post_to_every_worker(std::function<void(Worker&)> fn) {
  auto g = std::make_shared<WorkerGather>(control_.get_executor(), shared_.workers.size());
  for (Worker* w : shared_.workers) {
    if (w->stopped()) {  // drained: its loop runs no more (nothing of it to change or read)
      --g->remaining;
      continue;
    }
    asio::post(w->io(), [w, g, fn, this] {
      fn(*w);  // on w's own thread
      asio::post(control_, [g] {
        if (--g->remaining == 0) g->timer.cancel();
      });
    });
  }
  g->timer.expires_after(std::chrono::seconds(2));
  return g;
}

core::Task<std::size_t> AdminServer::wait_for_workers(std::shared_ptr<WorkerGather> g) {
  if (g->remaining == 0) co_return 0;
  co_await g->timer.async_wait(core::use_task);
  // The timer ends either way (cancelled by the last worker, or expired): the count says which.
  co_return g->remaining;
}

core::Task<std::size_t> AdminServer::publish(std::shared_ptr<const auth::AuthPolicy> policy) {
  // The control thread's view follows too (metrics, tenants, keys in Redis): a policy kept there past the
  // next key change would hold its admission scopes, and through each carry's pin every scope its tenants
  // and keys were given since, from reuse (admission/scope_ledger.hpp) until the next reload.
  if (policy) {
    shared_.auth_policy = policy;
    if (redis_) redis_->set_base(policy);
  }
  auto g = post_to_every_worker([policy](Worker& w) {
    if (auto* a = w.authenticator()) a->set_policy(policy);
  });
  co_return co_await wait_for_workers(std::move(g));
}

core::Task<std::size_t> AdminServer::forget_redis_keys() {
  auto g = post_to_every_worker([](Worker& w) {
    if (auto* a = w.authenticator()) a->forget_redis_keys();
  });
  co_return co_await wait_for_workers(std::move(g));
}

AdminResponse AdminServer::applied_response(int status, json::object& o, std::size_t pending) {
  if (pending == 0) return json_response(status, o);
  // Saved, and on its way to the workers still behind (their posts run when their loops get to them), but
  // not in force everywhere yet: 202 (RFC 9110 §15.3.3), with the body a client needs (a new secret is
  // shown only here), rather than a success that claims more, or an error that loses the secret.
  o["pending_workers"] = pending;
  return json_response(202, o);
}

core::Task<AdminResponse> AdminServer::metrics(AdminRequest&) {
  AdminResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  // The control thread's view (a reload replaces these on this thread).
  const std::shared_ptr<const Generation> gen = shared_.generation;
  const std::shared_ptr<const auth::AuthPolicy> policy = shared_.auth_policy;
  co_await collect_metrics_text(shared_, control_, r.body, gen, policy);
  co_return r;
}

core::Task<AdminResponse> AdminServer::ready(AdminRequest&) {
  // The client port's answers (GatewayPhases::serve_own), word for word: a probe reads either port the same way.
  // The pools' health as the client port's /ready sees it (the control thread's generation).
  std::string why = shared_.draining.load() ? "Weir is draining." : ready_problem(*shared_.generation, false);
  if (why.empty()) co_return AdminResponse{200, R"({"status":"ready"})"};
  AdminResponse r = error_response(AdminError{503, "server_error", "service_unavailable", std::move(why), {}});
  r.headers.emplace_back("Retry-After", "1");
  co_return r;
}

std::optional<std::string_view> AdminServer::first_query_parameter(std::string_view query) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (!pair.empty()) return pair.substr(0, pair.find('='));
  }
  return std::nullopt;
}

core::Task<AdminResponse> AdminServer::query_refused(AdminRequest& r) {
  const std::string_view name = core::utf8_prefix(first_query_parameter(r.query).value_or(""), 64);
  co_return error_response(admin_bad_request(
      fmt::format("Unrecognized query parameter: '{}' ({} {} takes no query parameters)", name, r.method, r.path),
      std::string(name)));
}

std::optional<AdminError> AdminServer::unread_body_error(const AdminRequest& r) {
  if (r.body.find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  auto body = parse_object(r.body);
  if (!body) return body.error();
  if (body->empty()) return std::nullopt;
  const std::string name{core::utf8_prefix(body->begin()->key(), 64)};
  return admin_bad_request(fmt::format("unknown field '{}': {} {} takes no parameters (send no body or {{}})", name,
                                       core::utf8_prefix(r.method, 16), core::utf8_prefix(r.path, 256)),
                           name);
}

core::Task<AdminResponse> AdminServer::body_refused(AdminRequest& r) {
  co_return error_response(*unread_body_error(r));
}

core::Task<AdminResponse> AdminServer::list_requests(AdminRequest& r) {
  if (!requests_) co_return error_response(no_request_log());
  auto q = requestlog::parse_query(r.query);
  if (!q) co_return store_error(q.error());
  requestlog::Reader* reader = requests_.get();
  const requestlog::Query& query = *q;  // lives in this frame across the co_await
  auto page = co_await run_blocking(blocking_, [reader, &query] { return reader->query_json(query); });
  if (!page) co_return store_error(page.error());
  co_return AdminResponse{200, std::move(*page)};
}

core::Task<AdminResponse> AdminServer::get_request(AdminRequest& r) {
  if (!requests_) co_return error_response(no_request_log());
  requestlog::Reader* reader = requests_.get();
  const std::string& id = r.params.at(0);  // the request outlives the co_await
  auto one = co_await run_blocking(blocking_, [reader, &id] { return reader->get_json(id); });
  if (!one) co_return store_error(one.error());
  if (!*one) co_return error_response(admin_not_found("No stored request has the id " + id + "."));
  co_return AdminResponse{200, std::move(**one)};
}

// ---------------------------------------------------------------- console and dashboards

std::optional<AdminResponse> AdminServer::console_file(const AdminRequest& r) const {
  const std::string_view path = r.path;
  const bool get = r.method == "GET" || r.method == "HEAD";
  auto redirect = [](int status, std::string_view to) {
    AdminResponse a{status, {}, "text/plain; charset=utf-8"};
    a.body = fmt::format("See {}\n", to);
    a.headers.emplace_back("Location", std::string(to));
    return a;
  };
  // `/` (the redirect to the console) and the console's files need no
  // token, for any method: a method they do not take is a 405 (RFC 9110
  // §15.5.6), not the token check's 401; a file the console does not have
  // is a 404 whatever the method (a 405 says the resource exists).
  if (path != "/" && path != "/console" && !path.starts_with("/console/")) return std::nullopt;
  const console::Asset* f = path.starts_with("/console/") ? console::find(path) : nullptr;
  // Their refusals in the JSON error shape of every other answer of this listener.
  if (path.starts_with("/console/") && !f)
    return error_response(AdminError{404,
                                     "invalid_request_error",
                                     "unknown_url",
                                     fmt::format("The console has no file {}.", core::utf8_prefix(path, 256)),
                                     {}});
  if (!get) {
    AdminResponse a = error_response(AdminError{
        405,
        "invalid_request_error",
        "method_not_allowed",
        fmt::format("Method {} is not allowed on {} ({}: GET, HEAD).", core::utf8_prefix(r.method, 16),
                    core::utf8_prefix(path, 256), path == "/" ? "a redirect to the console" : "the console's files"),
        {}});
    a.headers.emplace_back("Allow", "GET, HEAD");
    return a;
  }
  if (path == "/") return redirect(302, "/console/");
  if (path == "/console") return redirect(301, "/console/");
  AdminResponse a;
  // The files keep their names from build to build: revalidate each time
  // (one round trip, a 304 without the body while the ETag still matches).
  a.cache_control = "no-cache";
  a.headers.emplace_back("ETag", std::string(f->etag));
  if (!r.if_none_match.empty() && console::etag_matches(r.if_none_match, f->etag)) {
    a.status = 304;
    return a;
  }
  a.content_type = std::string(f->content_type);
  a.body = std::string(f->body);
  return a;
}

core::Task<AdminResponse> AdminServer::stats(AdminRequest&) {
  const std::shared_ptr<const MetricLabels> labels = shared_.generation->labels;  // lives across the co_await
  const std::shared_ptr<MetricsShard> total = co_await collect_metrics(shared_, control_, labels);
  json::object o = total->stats_json();
  o["time_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  co_return json_response(200, o);
}

}  // namespace weir::gateway
