#include "gateway/generation.hpp"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>

#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "auth/crypto.hpp"
#include "core/yaml.hpp"

namespace weir::gateway {

namespace {

// A secret as its SHA-256 (hex), so the fingerprint does not keep it in
// clear; nothing for none: a pool without a key or TLS files never loads
// OpenSSL's providers (~3 MB of resident memory) for its fingerprint.
std::string digest_of(std::string_view secret) {
  return secret.empty() ? std::string() : auth::to_hex(auth::sha256(secret));
}

void append_file(std::string& out, const std::string& path) {
  if (path.empty()) return;
  std::ifstream in(path, std::ios::binary);
  out += "\nfile:";
  out += path;
  out += ':';
  if (!in) {
    out += "missing";
    return;
  }
  out += auth::to_hex(auth::sha256(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>())));
}

}  // namespace

std::string pool_fingerprint(const core::Config& cfg, const core::PoolConfig& pool) {
  std::string f;
  const YAML::Node& root = cfg.root;
  if (root && root["pools"] && root["pools"][pool.name]) {
    f = core::canonical_yaml(root["pools"][pool.name]);
  } else {
    for (const auto& e : pool.endpoints) f += e.url + '\n';
  }
  f += "\napi_key:";
  f += digest_of(pool.api_key);  // from api_key_env: the environment's value
  append_file(f, pool.tls.ca_file);
  append_file(f, pool.tls.client_cert);
  append_file(f, pool.tls.client_key);
  f += fmt::format("\nmax_response:{}", cfg.server.max_response_bytes);
  return f;
}

namespace {

Resolution resolve_one(const EndpointName& n) {
  Resolution out;
  boost::system::error_code ec;
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  auto r = resolver.resolve(n.host, std::to_string(n.port), ec);
  if (!ec)
    for (const auto& entry : r)
      if (std::find(out.addrs.begin(), out.addrs.end(), entry.endpoint()) == out.addrs.end())
        out.addrs.push_back(entry.endpoint());
  if (out.addrs.empty()) out.error = ec ? ec.message() : "no address";
  return out;
}

core::ConfigError resolve_error(const core::Config& cfg, const core::PoolConfig& pool, std::size_t i,
                                const std::string& why) {
  const auto& e = pool.endpoints.at(i);
  return core::ConfigError{.file = cfg.source,
                           .line = e.line,
                           .column = e.column,
                           .key = fmt::format("pools.{}.endpoints[{}]", pool.name, i),
                           .message = fmt::format("cannot resolve {}: {}", e.display, why)};
}

}  // namespace

tl::expected<std::vector<http::tcp::endpoint>, core::ConfigError> resolve_endpoint(const core::Config& cfg,
                                                                                   const core::PoolConfig& pool,
                                                                                   std::size_t i) {
  const auto& e = pool.endpoints.at(i);
  auto r = resolve_one(EndpointName{e.host, e.port});
  if (r.addrs.empty()) return tl::unexpected(resolve_error(cfg, pool, i, r.error));
  return std::move(r.addrs);
}

std::vector<EndpointName> endpoint_names(const core::Config& cfg) {
  std::vector<EndpointName> out;
  for (const auto& pc : cfg.pools)
    for (const auto& e : pc.endpoints) out.push_back(EndpointName{e.host, e.port});
  return out;
}

std::vector<Resolution> resolve_names(const std::vector<EndpointName>& names) {
  std::vector<Resolution> out(names.size());
  // Names resolve independently: a slow one does not hold the others up, and
  // the wait is about the slowest one's, not the sum (a reload of 8 slow names).
  constexpr std::size_t kMaxThreads = 8;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < names.size(); i = next.fetch_add(1)) out[i] = resolve_one(names[i]);
  };
  std::vector<std::thread> threads;
  try {
    for (std::size_t t = 1; t < std::min(names.size(), kMaxThreads); ++t) threads.emplace_back(work);
  } catch (const std::system_error&) {
    // (No thread to be had: the ones started and this one take the names between them.)
  }
  work();
  for (auto& t : threads) t.join();
  return out;
}

tl::expected<ResolvedPools, core::ConfigError> take_resolutions(const core::Config& cfg,
                                                                std::vector<Resolution> resolved) {
  ResolvedPools out;
  std::size_t k = 0;
  for (const auto& pc : cfg.pools) {
    auto& pool = out.emplace_back();
    for (std::size_t i = 0; i < pc.endpoints.size(); ++i, ++k) {
      if (k >= resolved.size()) return tl::unexpected(resolve_error(cfg, pc, i, "not resolved"));
      if (resolved[k].addrs.empty()) return tl::unexpected(resolve_error(cfg, pc, i, resolved[k].error));
      pool.push_back(std::move(resolved[k].addrs));
    }
  }
  return out;
}

tl::expected<ResolvedPools, core::ConfigError> resolve_all(const core::Config& cfg) {
  return take_resolutions(cfg, resolve_names(endpoint_names(cfg)));
}

namespace {

// Whether two slots' endpoints resolved to the same addresses: per
// endpoint, the same set, in whatever order (DNS round robin rotates it).
bool same_addresses(const PoolSlot& a, const PoolSlot& b) {
  if (a.all_addrs.empty() || b.all_addrs.empty() || a.all_addrs.size() != b.all_addrs.size())
    return a.addrs == b.addrs && a.all_addrs == b.all_addrs;
  for (std::size_t i = 0; i < a.all_addrs.size(); ++i) {
    auto x = a.all_addrs[i], y = b.all_addrs[i];
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    if (x != y) return false;
  }
  return true;
}

}  // namespace

tl::expected<std::shared_ptr<const Generation>, std::string> build_generation(GenerationInput in,
                                                                              const Generation* previous) {
  auto g = std::make_shared<Generation>();
  g->id = previous ? previous->id + 1 : 1;
  g->config = std::move(in.config);
  g->routes = std::make_unique<routing::RouteTable>(*g->config);
  g->pricing = std::move(in.pricing);
  const auto& cfg = *g->config;
  for (std::size_t p = 0; p < cfg.pools.size(); ++p) {
    const auto& pc = cfg.pools[p];
    PoolSlot slot;
    slot.fingerprint = pool_fingerprint(cfg, pc);
    // Every endpoint is resolved again (as nginx does on a reload): a host
    // name that now resolves elsewhere is a changed pool.
    if (p < in.addrs.size() && in.addrs[p].size() == pc.endpoints.size()) {
      slot.addrs = in.addrs[p];
    } else {
      if (in.resolved.empty()) {
        auto all = resolve_all(cfg);
        if (!all) return tl::unexpected(all.error().to_string());
        in.resolved = std::move(*all);
      }
      if (p >= in.resolved.size() || in.resolved[p].size() != pc.endpoints.size())
        return tl::unexpected(fmt::format("pools.{}: its endpoints were not resolved", pc.name));
      for (auto& a : in.resolved[p]) {
        slot.addrs.push_back(a.front());
        slot.all_addrs.push_back(std::move(a));
      }
    }
    const PoolSlot* same = nullptr;
    if (previous)
      for (const auto& old : previous->pools)
        if (old.cfg->name == pc.name && old.fingerprint == slot.fingerprint && same_addresses(old, slot)) same = &old;
    if (same) {
      g->pools.push_back(*same);  // its objects go on as they are
      continue;
    }
    slot.owner = g->config;
    slot.cfg = &pc;
    slot.state = std::make_shared<routing::SharedPoolState>(pc, in.workers);
    for (const auto& all : slot.all_addrs)  // (one address needs no list)
      slot.state->addresses.push_back(all.size() > 1 ? all : std::vector<http::tcp::endpoint>());
    if (p < in.tls.size()) slot.state->tls = in.tls[p];
    // The endpoints a changed pool keeps (same URL) keep their scrape
    // failure counts: no counter on /metrics goes back at a reload.
    if (previous)
      for (const auto& old : previous->pools) {
        if (old.cfg->name != pc.name || !old.state) continue;
        for (std::uint32_t i = 0; i < pc.endpoints.size(); ++i)
          for (std::uint32_t j = 0; j < old.cfg->endpoints.size() && j < old.state->loads.size(); ++j)
            if (old.cfg->endpoints[j].url == pc.endpoints[i].url) {
              slot.state->loads.adopt_failures(i, old.state->loads, j);
              break;
            }
      }
    g->pools.push_back(std::move(slot));
  }
  g->labels = MetricLabels::build(cfg, in.policy, previous ? previous->labels.get() : nullptr);
  if (!g->labels)  // (models past ModelConfig::kMaxModels are refused before: only slots still held are left)
    return tl::unexpected(fmt::format(
        "models: the {} metrics label slots are taken by these {} models and those of earlier configurations "
        "whose requests still run: reload again once they have finished",
        MetricLabels::kModelSlots, cfg.models.size()));
  return std::shared_ptr<const Generation>(std::move(g));
}

}  // namespace weir::gateway
