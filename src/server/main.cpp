// weir: the gateway binary.
//   weir --config weir.yaml
//   weir --listen 127.0.0.1:8080 --upstream http://127.0.0.1:8000   (quick mode)
//   weir requests --db requests.db --tenant acme --status 5xx         (read the request log)
//   weir requests --url postgres://weir@db/weir --id REQUEST_ID
#include <array>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "core/process_metrics.hpp"
#include "gateway/generation.hpp"
#include "gateway/key_store.hpp"
#include "gateway/load_config.hpp"
#include "requestlog/query.hpp"
#include "server/server.hpp"

namespace {

// `weir requests`: the request-log store read without the admin API, through
// the same parse_query and Reader. Prints the JSON answer; 0, or 1 (not
// found), 2 (bad arguments or store).
struct RequestsArgs {
  std::string db, url, since, until, tenant, key_id, model, request_id, status, limit, cursor, id;
};

void append_param(std::string& q, std::string_view name, const std::string& value) {
  if (value.empty()) return;
  if (!q.empty()) q += '&';
  q += name;
  q += '=';
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == ':')
      q += static_cast<char>(c);
    else
      fmt::format_to(std::back_inserter(q), "%{:02X}", c);
  }
}

int run_requests(const RequestsArgs& a) {
  weir::requestlog::RequestLogConfig store;
  if (!a.url.empty()) {
    if (a.url.starts_with("postgres://") || a.url.starts_with("postgresql://")) {
      store.kind = weir::requestlog::StoreKind::postgres;
      store.url = a.url;
    } else if (a.url.starts_with("sqlite:")) {
      store.path = a.url.substr(a.url.starts_with("sqlite:///") ? 9 : 7);
    } else {
      fmt::print(stderr, "weir requests: --url: expected sqlite:/path/requests.db or postgres://user@host/db\n");
      return 2;
    }
  } else if (!a.db.empty()) {
    store.path = a.db;
  } else {
    fmt::print(stderr, "weir requests: give --db FILE (SQLite) or --url URL (sqlite:PATH or postgres://...)\n");
    return 2;
  }
  // SQLite says only "disk I/O error" for a directory: name it.
  if (struct stat st{}; !store.path.empty() && ::stat(store.path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    fmt::print(stderr, "weir requests: {} is a directory, not the SQLite file request_log.url names\n", store.path);
    return 2;
  }
  weir::requestlog::Reader reader(store);
  if (!a.id.empty()) {
    auto r = reader.get_json(a.id);
    if (!r) {
      fmt::print(stderr, "weir requests: {}\n", r.error().message);
      return 2;
    }
    if (!*r) {
      fmt::print(stderr, "weir requests: no request with id {}\n", a.id);
      return 1;
    }
    fmt::print("{}\n", **r);
    return 0;
  }
  std::string qs;
  append_param(qs, "since", a.since);
  append_param(qs, "until", a.until);
  append_param(qs, "tenant", a.tenant);
  append_param(qs, "key_id", a.key_id);
  append_param(qs, "model", a.model);
  append_param(qs, "request_id", a.request_id);
  append_param(qs, "status", a.status);
  append_param(qs, "limit", a.limit);
  append_param(qs, "cursor", a.cursor);
  auto q = weir::requestlog::parse_query(qs);
  if (!q) {
    std::string opt(q.error().param);
    for (char& c : opt)
      if (c == '_') c = '-';
    fmt::print(stderr, "weir requests: --{}: {}\n", opt, q.error().message);
    return 2;
  }
  auto r = reader.query_json(*q);
  if (!r) {
    fmt::print(stderr, "weir requests: {}\n", r.error().message);
    return 2;
  }
  fmt::print("{}\n", *r);
  return 0;
}

// glibc's allocator raises its mmap threshold to the size of each large
// block it frees (up to 32 MiB) and its trim threshold to twice that, so
// after a few large buffers (a slow client's stream backlog, ~3 MB each;
// a 1 MB prompt) later ones come from the worker's arena and up to twice
// their size stays resident at the arena's top for good: malloc_trim does
// not shrink a thread arena's top (glibc 2.36 mtrim), so the idle trim
// (Worker::trim_when_idle) could not give it back (RSS 21 MB idle after four
// slow-client cuts, 6 MB fresh). Fixed thresholds stop that: blocks from
// kMmapThreshold up are mapped and unmapped on their own, and an arena keeps
// at most kTrimThreshold free at its top. Every request's own blocks are far
// below both (a head, a body of a few KiB, an event); a body over 512 KiB
// pays an mmap and its page faults. GLIBC_TUNABLES' malloc settings, when
// given, are left to rule.
void bound_allocator_retention() {
  constexpr int kMmapThreshold = 512 << 10;  // bytes
  constexpr int kTrimThreshold = 1 << 20;    // bytes
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t && std::strstr(t, "glibc.malloc.")) return;
  ::mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  ::mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
}

}  // namespace

int main(int argc, char** argv) {
  // Descriptors 0, 1 and 2 open, on /dev/null where exec handed one down closed (`2>&-`, a careless
  // supervisor): else the first file Weir opens (the access log) takes the number, and every message meant
  // for stderr lands in the log.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int n = ::open("/dev/null", O_RDWR);  // (the lowest free number: this one)
    if (n >= 0 && n != fd) {
      ::dup2(n, fd);
      ::close(n);
    }
  }
  // SIGINT and SIGTERM wait, blocked, until server::run() installs their
  // handler (the drain): until then (parsing, loading, resolving, binding the
  // ports) their default action would kill a process that already listens,
  // or is about to. Blocked first of all, before any thread starts (every
  // thread inherits the mask) and before the command line is read: a
  // supervisor's SIGTERM right after exec is held as one during the load.
  // run() unblocks them once the handler is in place, and a signal that came
  // meanwhile is delivered then: a drain with nothing in flight, exit 0.
  // Without a server to drain (--help, --version, a usage error, `requests`,
  // --check) the mask is given back before anything slow: a Ctrl-C then ends
  // the process at once, as it always did.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGQUIT);  // nginx's graceful stop (a Dockerfile's STOPSIGNAL SIGQUIT): a drain too
  sigset_t inherited;                 // the mask exec handed down: given back where no server runs
  pthread_sigmask(SIG_BLOCK, &stop_signals, &inherited);
  // SIGHUP reopens the access log and reloads the configuration once the
  // server runs (server.cpp); until then (loading, resolving, binding) it
  // must not kill the process either.
  // SIGUSR1 (reopen the access log) and SIGUSR2 (no meaning): ignored until
  // server.cpp's handler takes them; their default action would end the process.
  // Every other signal whose default action ends the process and that no
  // event of Weir's sends (SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
  // SIGSTKFLT, the real-time ones) is ignored for good: a stray one (a
  // `kill -ALRM`, a UPS daemon's SIGPWR) would cut every stream with no
  // drain and no log line. SIGXFSZ too: past a file-size limit (`ulimit
  // -f`, systemd's LimitFSIZE=) a write then fails with EFBIG, and the
  // access log counts the lines lost, as on a full disk, where the signal
  // would kill the process mid-line. One with a handler already (a
  // profiler's SIGPROF, preloaded) keeps it. Where no server runs, the
  // dispositions exec handed down come back with the mask.
  struct HeldSignal {
    int sig;
    void (*inherited)(int);
  };
  std::vector<HeldSignal> held{{SIGHUP, nullptr}, {SIGUSR1, nullptr}, {SIGUSR2, nullptr}};
  for (auto& h : held) h.inherited = std::signal(h.sig, SIG_IGN);
  auto ignore_if_default = [&](int sig) {
    const auto before = std::signal(sig, SIG_IGN);
    if (before == SIG_DFL)
      held.push_back({sig, before});
    else if (before != SIG_ERR)
      std::signal(sig, before);  // a handler of someone's, or ignored already
  };
  for (const int sig : {SIGXFSZ, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT}) ignore_if_default(sig);
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) ignore_if_default(sig);
  auto give_back_signals = [&](bool mask) {
    for (const auto& h : held)
      if (h.inherited != SIG_ERR) std::signal(h.sig, h.inherited);
    if (mask) pthread_sigmask(SIG_SETMASK, &inherited, nullptr);
  };
  bound_allocator_retention();
  CLI::App app{"Weir: an AI inference gateway (OpenAI-compatible, streams SSE from vLLM pools)", "weir"};
  std::string config_path, listen, upstream, access_log;
  unsigned workers = 0;
  bool check = false;
  bool reuse_port = false;
  // A value given empty (`--id ''`, `--access-log ""`) is refused: taken as absent, it would widen a query
  // to every request, or fall back to the file's value where the user meant to override it.
  const CLI::Validator non_empty([](std::string& v) { return v.empty() ? std::string("must not be empty") : ""; },
                                 "NON-EMPTY");
  app.add_option("-c,--config", config_path, "YAML configuration file")->check(non_empty);
  app.add_option("--listen", listen,
                 "listen address host:port, over the file's listen (quick mode: default 127.0.0.1:8080)")
      ->check(non_empty);
  app.add_option("--upstream", upstream,
                 "quick mode: send every model to this server: http://host[:port] or https://host[:port][/base] "
                 "(a base path is an OpenAI-style base URL, e.g. https://api.openai.com/v1)")
      ->check(non_empty);
  auto* workers_opt =
      app.add_option("-w,--workers", workers, "worker threads, 0 = one per core (default: config, else one per core)")
          ->check(CLI::Range(0u, 1024u));  // (as the file's `workers`: 0, one per core)
  app.add_option("--access-log", access_log, "access log: '-' (stdout), 'off', or a file path")->check(non_empty);
  app.add_flag("--reuse-port", reuse_port,
               "start even if another process listens on the address (and admin.listen), and share them "
               "(SO_REUSEPORT), e.g. for a zero-downtime restart; same as server.reuse_port: true");
  app.add_flag("--check", check, "validate the configuration and exit");
  app.set_version_flag("--version",
                       fmt::format("weir {} ({})", weir::core::build_version(), weir::core::build_commit()));
  RequestsArgs ra;
  auto* requests = app.add_subcommand(
      "requests", "print requests from the request-log store (request_log:) as JSON, newest first, and exit");
  auto* db_opt =
      requests->add_option("--db", ra.db, "the SQLite file (request_log.url without sqlite:)")->check(non_empty);
  auto* url_opt =
      requests->add_option("--url", ra.url, "the store as request_log.url names it: sqlite:PATH or postgres://...")
          ->check(non_empty);
  db_opt->excludes(url_opt);
  requests->add_option("--since", ra.since, "RFC 3339 time or Unix seconds (inclusive)")->check(non_empty);
  requests->add_option("--until", ra.until, "RFC 3339 time or Unix seconds (exclusive)")->check(non_empty);
  requests->add_option("--tenant", ra.tenant, "tenant name")->check(non_empty);
  requests->add_option("--key-id", ra.key_id, "API key id")->check(non_empty);
  requests->add_option("--model", ra.model, "model as the client sent it")->check(non_empty);
  requests->add_option("--status", ra.status, "HTTP status (429) or class (5xx)")->check(non_empty);
  requests->add_option("--limit", ra.limit, "rows, 1..1000 (default 50)")->check(non_empty);
  requests->add_option("--cursor", ra.cursor, "next_cursor of the previous page")->check(non_empty);
  requests->add_option("--request-id", ra.request_id, "every request with this request id (a list, as the filters)")
      ->check(non_empty);
  auto* id_opt = requests
                     ->add_option("--id", ra.id,
                                  "one request by its request id, with its bodies: the newest if several share it "
                                  "(others_with_id says how many; --request-id lists them)")
                     ->check(non_empty);
  // --id answers one record: a list filter beside it would be ignored, so it is refused.
  for (const char* o :
       {"--since", "--until", "--tenant", "--key-id", "--model", "--request-id", "--status", "--limit", "--cursor"})
    id_opt->excludes(o);
  // `--access-log=` (an empty value after '='): CLI11 takes it for an option given without its value and
  // takes the next argument as the value (`--access-log= --check` wrote the log to a file named "--check").
  // Refused as an empty value is (non_empty), before the parse.
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a.starts_with("--") && a.size() > 3 && a.ends_with('=') && a.find('=') == a.size() - 1) {
      give_back_signals(true);
      fmt::print(stderr, "{}: must not be empty\nRun with --help for more information.\n", a.substr(0, a.size() - 1));
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version: 0. A usage error (an unknown flag, a value out of range) exits 2, as the same
    // mistake in the configuration file does. (A signal held during the parse ends the process now.)
    give_back_signals(true);
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (*requests) {
    give_back_signals(true);  // (a query of the store: Ctrl-C stops it, as a hang-up does)
    return run_requests(ra);
  }
  // --check runs no server: its load may be slow (a configuration read from a pipe, `-c <(generator)`; a host
  // that resolves slowly), and Ctrl-C must end it then, not wait for the load to finish.
  if (check) {
    give_back_signals(false);
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
  }

  // One loader for --check and for start-up: both accept and refuse the same files.
  weir::gateway::ConfigSource source;
  if (!config_path.empty()) {
    if (!upstream.empty()) {
      fmt::print(stderr, "weir: give either --config or --upstream, not both\n");
      return 2;
    }
    source.file = config_path;
  } else if (!upstream.empty()) {
    source.upstream = upstream;
  } else {
    fmt::print(stderr, "weir: give --config FILE, or --upstream URL for quick mode (see --help)\n");
    return 2;
  }
  source.listen = listen;
  auto loaded = weir::gateway::load_config(source);
  if (!loaded) {
    fmt::print(stderr, "weir: configuration error: {}\n", loaded.error().to_string());
    return 2;
  }
  for (const auto& w : loaded->warnings) fmt::print(stderr, "weir: warning: {}\n", w);
  if (check) {
    // The runtime keys file is read as start-up reads it (Services), and not written.
    if (loaded->auth && loaded->admin && !loaded->admin->keys_file.empty()) {
      weir::gateway::KeyStore keys(*loaded->auth, loaded->admin->keys_file);
      if (auto ok = keys.load(); !ok) {
        auto e = weir::core::config_error(weir::core::node_at(loaded->config.root, "admin.keys_file"), "", ok.error());
        e.file = loaded->config.source;
        fmt::print(stderr, "weir: configuration error: {}\n", e.to_string());
        return 2;
      }
    }
    const auto& c = loaded->config;
    // The access log start-up will open (append, created if missing): a file
    // it could not write is refused here too, without creating it.
    const std::string log = access_log.empty() ? c.server.access_log : access_log;
    if (log != "-" && log != "off" && !log.empty()) {
      const auto slash = log.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : log.substr(0, slash);
      struct stat st {};
      const bool exists = ::stat(log.c_str(), &st) == 0;
      if (exists && S_ISDIR(st.st_mode)) errno = EISDIR;
      // A FIFO with no reader: start-up's open refuses it (it does not wait).
      bool no_reader = false;
      if (exists && S_ISFIFO(st.st_mode)) {
        const int fd = ::open(log.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) ::close(fd);
        no_reader = fd < 0 && errno == ENXIO;
      }
      if (no_reader || (exists && S_ISDIR(st.st_mode)) ||
          (exists ? ::access(log.c_str(), W_OK) != 0 : ::access(dir.c_str(), W_OK | X_OK) != 0)) {
        const int err = errno;
        auto e = access_log.empty() ? weir::core::config_error(weir::core::node_at(c.root, "server.access_log"),
                                                               "server.access_log", "")
                                    : weir::core::ConfigError{.key = "--access-log"};
        const std::string shown = weir::core::quoted_text(log, weir::core::kQuotedPathBytes);
        e.message = no_reader ? fmt::format("cannot open {} for writing: a pipe with no reader", shown)
                              : fmt::format("cannot open {} for writing: {}", shown, std::strerror(err));
        e.file = c.source;
        fmt::print(stderr, "weir: configuration error: {}\n", e.to_string());
        return 2;
      }
    }
    // The listeners' hosts resolve and do not overlap, as start-up checks.
    if (auto ok = weir::gateway::check_listen_addresses(*loaded); !ok) {
      fmt::print(stderr, "weir: configuration error: {}\n", ok.error());
      return 2;
    }
    // Every endpoint's host resolves, as start-up and a reload resolve it (gateway::build_generation).
    // (Names in parallel: the wait is about the slowest one's.)
    if (auto a = weir::gateway::resolve_all(c); !a) {
      fmt::print(stderr, "weir: configuration error: {}\n", a.error().to_string());
      return 2;
    }
    fmt::print("{}: ok ({} pools, {} models)\n", c.source, c.pools.size(), c.models.size());
    return 0;
  }
  std::optional<unsigned> cli_workers;
  if (workers_opt->count() > 0) cli_workers = workers;
  return weir::server::run(std::move(*loaded), {cli_workers, access_log, reuse_port, source});
}
