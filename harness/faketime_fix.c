/* Preloaded before libfaketime for the roles of a clock_skew scenario (harness/clock.py): monotonic sleeps go to the
 * kernel untouched.
 *
 * With FAKETIME_DONT_FAKE_MONOTONIC=1 (the wall clock moved, monotonic clocks real), libfaketime 0.9.10 (Debian 12)
 * still rewrites the deadline of clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...): it passes the kernel a
 * negative time, and the call fails with EINVAL. Python 3.11+ sleeps exactly that way (time.sleep, and every wait
 * built on it: subprocess's wait with a timeout, retry back-offs), so a correct program failed in a skewed role
 * (upstream: wolfcw/libfaketime issue 426). A monotonic clock that is not faked needs no rewriting: this
 * clock_nanosleep sends it to the kernel as it is, and hands every other clock (CLOCK_REALTIME: the faked one) to
 * the next definition, libfaketime's.
 *
 * Built by scripts/bootstrap.sh (or by the harness at first use) with: cc -shared -fPIC -O2 -o F.so F.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

static int kept_real(clockid_t id) {
  const char *real = getenv("FAKETIME_DONT_FAKE_MONOTONIC");
  if (real == NULL || strcmp(real, "1") != 0) return 0;
  return id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_RAW || id == CLOCK_MONOTONIC_COARSE || id == CLOCK_BOOTTIME;
}

int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
  static clock_nanosleep_fn next;
  if (kept_real(id)) {
    int saved = errno;
    long r = syscall(SYS_clock_nanosleep, id, flags, req, rem);
    int err = r == -1 ? errno : 0; /* clock_nanosleep returns the error number; errno is left as it was */
    errno = saved;
    return err;
  }
  if (next == NULL) next = (clock_nanosleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
  if (next == NULL) return ENOSYS;
  return next(id, flags, req, rem);
}
