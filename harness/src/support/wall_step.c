/* An LD_PRELOAD shim for the tests: steps the wall clock of one process
 * alone (CLOCK_REALTIME and what reads it), as NTP or an operator does;
 * the monotonic clock is left as it is. The step, in ns, is the 8-byte
 * little-endian integer in the file WALL_STEP_FILE, mapped shared so the
 * test can change it while the process runs. Clocks are read with the raw
 * syscall: no dlsym, so nothing here allocates (libfaketime's dlsym under
 * Envoy's tcmalloc deadlocks at start). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const volatile int64_t *step_ns;
static int mapped;

static int64_t step(void) {
  if (!__atomic_load_n(&mapped, __ATOMIC_ACQUIRE)) {
    const char *path = getenv("WALL_STEP_FILE");
    void *p = MAP_FAILED;
    if (path) {
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
      }
    }
    step_ns = p == MAP_FAILED ? NULL : p;
    __atomic_store_n(&mapped, 1, __ATOMIC_RELEASE);
  }
  return step_ns ? __atomic_load_n(step_ns, __ATOMIC_RELAXED) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
  long r = syscall(SYS_clock_gettime, id, ts);
  if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + step();
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
  }
  return (int)r;
}

int gettimeofday(struct timeval *tv, void *tz) {
  (void)tz;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (tv) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return 0;
}

time_t time(time_t *t) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (t) {
    *t = ts.tv_sec;
  }
  return ts.tv_sec;
}
