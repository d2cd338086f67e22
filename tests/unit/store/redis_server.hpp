// A real redis-server (Debian's, installed by scripts/setup) for tests: a
// free port, a temp dir, no persistence; start() returns once PING answers.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace weir::testing {

class RedisServer {
 public:
  // Starts redis-server on a free port; `extra` are more command-line
  // arguments (e.g. {"--requirepass", "secret"}). Check ok().
  explicit RedisServer(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {
    char tmpl[] = "/tmp/weir-redis-XXXXXX";
    if (const char* d = mkdtemp(tmpl)) dir_ = d;
    // A port taken between the probe and redis-server's bind fails start(): try another.
    for (int attempt = 0; attempt < 5 && !ok_; ++attempt) {
      port_ = free_port();
      ok_ = port_ != 0 && start();
    }
  }
  ~RedisServer() {
    kill();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool ok() const { return ok_; }
  std::uint16_t port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  // (Re)starts on port() and waits until PING answers +PONG (at most 10 s).
  bool start() {
    if (pid_ > 0) return true;
    std::vector<std::string> args = {"redis-server", "--port",    std::to_string(port_), "--bind",      "127.0.0.1",
                                     "--save",       "",          "--appendonly",        "no",          "--dir",
                                     dir_,           "--logfile", dir_ + "/redis.log",   "--daemonize", "no"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawnp(&pid, "redis-server", nullptr, nullptr, argv.data(), environ) != 0) return false;
    pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: port taken, bad flag
        pid_ = -1;
        return false;
      }
      if (ping()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polls readiness, bounded by the deadline
    }
    kill();
    return false;
  }

  // SIGKILL and reap: connections see a reset, the data is gone.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT: a server that accepts bytes and never answers.
  void pause() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  // One blocking PING (200 ms budget). `auth`: AUTH password first.
  bool ping(const std::string& auth = "") const {
    for (const auto& a : extra_)
      if (a == "--requirepass" && auth.empty()) return ping_with(requirepass());
    return ping_with(auth);
  }

 private:
  std::string requirepass() const {
    for (std::size_t i = 0; i + 1 < extra_.size(); ++i)
      if (extra_[i] == "--requirepass") return extra_[i + 1];
    return {};
  }

  bool ping_with(const std::string& auth) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      std::string req;
      if (!auth.empty()) req += "AUTH " + auth + "\r\n";
      req += "PING\r\n";
      if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
        std::string got;
        char buf[256];
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
        while (got.find("PONG") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
          pollfd p{fd, POLLIN, 0};
          if (::poll(&p, 1, 50) <= 0) continue;
          const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
          if (n <= 0) break;
          got.append(buf, static_cast<std::size_t>(n));
        }
        ok = got.find("+PONG") != std::string::npos;
      }
    }
    ::close(fd);
    return ok;
  }

  static std::uint16_t free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::uint16_t port = 0;
    socklen_t len = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    ::close(fd);
    return port;
  }

  std::vector<std::string> extra_;
  std::string dir_;
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
  bool ok_ = false;
};

}  // namespace weir::testing
