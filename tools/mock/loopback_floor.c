// The kernel's floor under weir-mock's per-token cost: CPU time of one small
// TCP_NODELAY send over loopback, with 2,000 connections (the mock's
// capacity note in README.md compares against it). Not part of the build:
//
//   cc -O2 -o /tmp/loopback_floor tools/mock/loopback_floor.c -lpthread && /tmp/loopback_floor
//
// The writer (pinned to CPU 0) sends 280-byte segments round-robin over the
// connections as fast as the blocking sockets let it; a reader thread
// (pinned to CPU 1) drains them with epoll. Prints sends/s and the writer's
// CPU per send.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { kConns = 2000, kBytes = 280, kSeconds = 8 };
static int server_side[kConns], client_side[kConns], epfd;

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void* reader(void* arg) {
  (void)arg;
  pin(1);
  struct epoll_event ev[256];
  static char buf[65536];
  for (;;) {
    int n = epoll_wait(epfd, ev, 256, -1);
    for (int i = 0; i < n; i++)
      while (read(ev[i].data.fd, buf, sizeof buf) > 0) {
      }
  }
  return NULL;
}

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
  struct rlimit rl = {65536, 65536};
  setrlimit(RLIMIT_NOFILE, &rl);
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(listener, (struct sockaddr*)&addr, sizeof addr) || listen(listener, 4096) ||
      getsockname(listener, (struct sockaddr*)&addr, &len)) {
    perror("listen");
    return 1;
  }
  epfd = epoll_create1(0);
  int one = 1;
  for (int i = 0; i < kConns; i++) {
    client_side[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(client_side[i], (struct sockaddr*)&addr, sizeof addr);
    server_side[i] = accept(listener, NULL, NULL);
    if (server_side[i] < 0) {
      perror("accept");
      return 1;
    }
    setsockopt(server_side[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event e = {.events = EPOLLIN | EPOLLET, .data.fd = client_side[i]};
    epoll_ctl(epfd, EPOLL_CTL_ADD, client_side[i], &e);
  }
  pthread_t t;
  pthread_create(&t, NULL, reader, NULL);
  pin(0);
  char msg[kBytes];
  memset(msg, 'x', sizeof msg);
  long sent = 0;
  const double t0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_THREAD_CPUTIME_ID);
  for (int k = 0; seconds(CLOCK_MONOTONIC) - t0 < kSeconds; k = (k + 1) % kConns)
    if (write(server_side[k], msg, sizeof msg) == (ssize_t)sizeof msg) sent++;
  const double elapsed = seconds(CLOCK_MONOTONIC) - t0, cpu = seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
  printf("sends/s %.0f  writer cpu %.0f%%  = %.2f us per send\n", (double)sent / elapsed, 100 * cpu / elapsed,
         1e6 * cpu / (double)sent);
  return 0;
}
