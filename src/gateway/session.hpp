// One downstream (client) connection: the loop over its keep-alive
// requests. Each request is read by the transport (http::Downstream) and
// run through the phases (gateway/pipeline.hpp); this object holds only the
// connection and the objects it reuses across requests. Lives on one
// worker thread.
#pragma once

#include <memory>

#include "gateway/context.hpp"
#include "gateway/phases.hpp"
#include "http/downstream.hpp"
#include "http/exchange.hpp"
#include "http/io.hpp"

namespace weir::gateway {

class Worker;

class Session final : private http::Downstream::Listener {
 public:
  Session(Worker& w, http::Socket sock);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Serves the connection until it closes; owns the session.
  static core::Task<void> run(std::unique_ptr<Session> self);

  // Drain: closes the connection if it is between requests (a request
  // already in its socket is served first); a request in flight is its
  // last, and its answer's head says `Connection: close` when it has not
  // gone out yet (RFC 9112 §9.6); after one that went out promising
  // keep-alive, a next request already here is served as the last
  // (http::Downstream::begin_drain).
  void close_if_idle() { down_.begin_drain(); }
  // Drain deadline: closes the connection whatever it is doing.
  void force_close();

  Session* prev = nullptr;  // the worker's intrusive list
  Session* next = nullptr;

 private:
  // The client closed while a request was in flight (GatewayPhases::on_client_gone).
  void on_client_gone() override;

  Worker& w_;
  // The configuration the connection was accepted under: its server limits
  // and timeouts (server:) hold for the connection's life; a reload applies
  // them to new connections (each request runs on the generation current
  // when it starts).
  std::shared_ptr<const core::Config> config_;
  http::Downstream down_;
  http::Exchange exchange_;  // the direct upstream exchange, reused by each request
  RequestContext ctx_;
  bool in_request_ = false;  // ctx_ is a request in flight (its pipeline runs)
  GatewayPhases phases_;
};

}  // namespace weir::gateway
