// An LD_PRELOAD shim for the end-to-end tests (test_net_60.py): getaddrinfo(3)
// of the names WEIR_GAI_SHIM lists answers after a delay, with the addresses
// given, as a slow DNS server or a name with several addresses would, with
// no DNS server, root or /etc/hosts change. Weir links glibc dynamically, so
// its resolver's getaddrinfo is this one. Every other name: glibc's.
//
//   WEIR_GAI_SHIM="name=DELAY_MS=ADDR,ADDR;name2=DELAY_MS=ADDR"
//
// A listed name with no address that parses answers EAI_NONAME after its delay.
// WEIR_GAI_SHIM_LOG=FILE: each listed name asked for is appended to FILE (a
// line) before its delay, so a test knows the resolution began.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

typedef int (*gai_fn)(const char*, const char*, const struct addrinfo*, struct addrinfo**);

int getaddrinfo(const char* node, const char* service, const struct addrinfo* hints, struct addrinfo** res) {
  gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
  const char* spec = getenv("WEIR_GAI_SHIM");
  if (node == NULL || spec == NULL) return real(node, service, hints, res);
  const size_t nlen = strlen(node);
  for (const char* p = spec; *p;) {
    const char* end = strchr(p, ';');
    if (end == NULL) end = p + strlen(p);
    const char* eq = memchr(p, '=', (size_t)(end - p));
    if (eq != NULL && (size_t)(eq - p) == nlen && strncasecmp(p, node, nlen) == 0) {
      const char* log = getenv("WEIR_GAI_SHIM_LOG");
      if (log != NULL) {
        const int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) {
          char line[256];
          const size_t l = nlen < sizeof line - 1 ? nlen : sizeof line - 1;
          memcpy(line, node, l);
          line[l] = '\n';
          (void)!write(fd, line, l + 1);
          close(fd);
        }
      }
      char* rest = NULL;
      const long ms = strtol(eq + 1, &rest, 10);
      if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
      }
      struct addrinfo* head = NULL;
      struct addrinfo** tail = &head;
      for (const char* a = *rest == '=' ? rest + 1 : end; a < end;) {
        const char* c = memchr(a, ',', (size_t)(end - a));
        if (c == NULL) c = end;
        char buf[64];
        size_t l = (size_t)(c - a);
        if (l >= sizeof buf) l = sizeof buf - 1;
        memcpy(buf, a, l);
        buf[l] = 0;
        struct addrinfo h;
        memset(&h, 0, sizeof h);
        if (hints != NULL) h = *hints;
        h.ai_flags = (h.ai_flags & ~AI_ADDRCONFIG) | AI_NUMERICHOST;  // (loopback-only hosts: keep ::1)
        struct addrinfo* one = NULL;
        if (real(buf, service, &h, &one) == 0) {
          *tail = one;
          while (*tail != NULL) tail = &(*tail)->ai_next;
        }
        a = c + 1;
      }
      if (head == NULL) return EAI_NONAME;
      *res = head;
      return 0;
    }
    p = *end ? end + 1 : end;
  }
  return real(node, service, hints, res);
}
