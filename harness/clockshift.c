/* clockshift OFFSET -- PROGRAM [ARG...]: run PROGRAM with its wall clock OFFSET seconds away (harness/clock.py).
 *
 * For the programs libfaketime cannot reach: a Go program (its runtime reads the clock through the vDSO, never
 * through libc) or any static binary. Nothing is preloaded; the kernel's answers are changed instead:
 *
 *   1. This process forks a tracer, lets it attach (PTRACE_SEIZE; the tracer leaves the process group, so the
 *      harness's signals to the role's group reach the program alone), installs a seccomp filter that hands the
 *      wall-clock system calls to the tracer (clock_gettime of CLOCK_REALTIME / _COARSE / CLOCK_TAI, gettimeofday,
 *      time) and execs PROGRAM.
 *   2. At the exec the tracer hides the vDSO from the new program (its AT_SYSINFO_EHDR auxv entry becomes
 *      AT_IGNORE): the Go runtime and libc then read every clock with a real system call.
 *   3. Each wall-clock call stops at the tracer, which answers it itself (its own clock + OFFSET) and skips the
 *      call. Monotonic clocks, sleeps and timeouts are untouched. Threads, forks and execs are followed.
 *   4. Signals pass through; a stop signal (SIGSTOP) stops the program for real (PTRACE_LISTEN) until SIGCONT.
 *
 * x86_64 Linux only (elsewhere it refuses to start, and the harness records the offset as not applied).
 * Built by scripts/bootstrap.sh (or by the harness at first use): cc -O2 -o clockshift clockshift.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef __x86_64__
int main(void) {
  fprintf(stderr, "clockshift: x86_64 only\n");
  return 125;
}
#else

#define AT_NULL_ 0
#define AT_IGNORE_ 1
#define AT_SYSINFO_EHDR_ 33

static int64_t offset_ns;

static void die(const char *what) {
  fprintf(stderr, "clockshift: %s: %s\n", what, strerror(errno));
  _exit(125);
}

static int poke(pid_t pid, unsigned long addr, const void *data, size_t len) {
  /* len is a multiple of 8 here (timespec, timeval, time_t) */
  for (size_t i = 0; i < len; i += sizeof(long)) {
    long word;
    memcpy(&word, (const char *)data + i, sizeof(long));
    if (ptrace(PTRACE_POKEDATA, pid, (void *)(addr + i), (void *)word) == -1) return -1;
  }
  return 0;
}

static struct timespec shifted(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  int64_t ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + offset_ns;
  ts.tv_sec = ns / 1000000000LL;
  ts.tv_nsec = ns % 1000000000LL;
  if (ts.tv_nsec < 0) {
    ts.tv_nsec += 1000000000LL;
    ts.tv_sec -= 1;
  }
  return ts;
}

/* A wall-clock system call stopped by the seccomp filter: answered here, and skipped. */
static void answer(pid_t pid) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, pid, 0, &regs) == -1) return;
  long result = 0;
  switch (regs.orig_rax) {
    case SYS_clock_gettime: {
      struct timespec ts = shifted((clockid_t)regs.rdi);
      if (regs.rsi == 0 || poke(pid, regs.rsi, &ts, sizeof ts) == -1) result = -EFAULT;
      break;
    }
    case SYS_gettimeofday: {
      struct timespec ts = shifted(CLOCK_REALTIME);
      struct timeval tv = {.tv_sec = ts.tv_sec, .tv_usec = ts.tv_nsec / 1000};
      if (regs.rdi != 0 && poke(pid, regs.rdi, &tv, sizeof tv) == -1) result = -EFAULT;
      break;
    }
    case SYS_time: {
      struct timespec ts = shifted(CLOCK_REALTIME);
      time_t t = ts.tv_sec;
      result = (long)t;
      if (regs.rdi != 0 && poke(pid, regs.rdi, &t, sizeof t) == -1) result = -EFAULT;
      break;
    }
    default:
      return; /* not ours: let it run */
  }
  regs.orig_rax = -1; /* skip the call; its result is rax */
  regs.rax = (unsigned long)result;
  ptrace(PTRACE_SETREGS, pid, 0, &regs);
}

/* At an exec: the new program's auxv loses its AT_SYSINFO_EHDR, so it finds no vDSO and makes real calls. */
static void hide_vdso(pid_t pid) {
  struct user_regs_struct regs;
  if (ptrace(PTRACE_GETREGS, pid, 0, &regs) == -1) return;
  unsigned long at = regs.rsp;
  errno = 0;
  long argc = ptrace(PTRACE_PEEKDATA, pid, (void *)at, 0);
  if (errno) return;
  at += sizeof(long) * (argc + 2); /* argc, argv[0..argc-1], NULL */
  for (int i = 0; i < 100000; i++, at += sizeof(long)) { /* envp until NULL */
    errno = 0;
    long word = ptrace(PTRACE_PEEKDATA, pid, (void *)at, 0);
    if (errno) return;
    if (word == 0) break;
  }
  at += sizeof(long);
  for (int i = 0; i < 512; i++, at += 2 * sizeof(long)) {
    errno = 0;
    long type = ptrace(PTRACE_PEEKDATA, pid, (void *)at, 0);
    if (errno || type == AT_NULL_) return;
    if (type == AT_SYSINFO_EHDR_) ptrace(PTRACE_POKEDATA, pid, (void *)at, (void *)(long)AT_IGNORE_);
  }
}

static int trace(pid_t program) {
  int code = 0;
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, __WALL);
    if (pid == -1) {
      if (errno == EINTR) continue;
      return code; /* ECHILD: nothing traced is left */
    }
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      if (pid == program) code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      continue;
    }
    if (!WIFSTOPPED(status)) continue;
    int sig = WSTOPSIG(status), event = status >> 16;
    if (event == PTRACE_EVENT_SECCOMP) {
      answer(pid);
      ptrace(PTRACE_CONT, pid, 0, 0);
    } else if (event == PTRACE_EVENT_EXEC) {
      hide_vdso(pid);
      ptrace(PTRACE_CONT, pid, 0, 0);
    } else if (event == PTRACE_EVENT_STOP) {
      if (sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU)
        ptrace(PTRACE_LISTEN, pid, 0, 0); /* a group stop: stays stopped until SIGCONT */
      else
        ptrace(PTRACE_CONT, pid, 0, 0); /* a new thread's or process's first stop */
    } else if (event != 0) {
      ptrace(PTRACE_CONT, pid, 0, 0); /* clone, fork, vfork, exit events */
    } else {
      ptrace(PTRACE_CONT, pid, 0, (void *)(long)sig); /* a signal: delivered as it came */
    }
  }
}

static void filter(void) { /* after the tracer attached: a traced call with no tracer would fail with ENOSYS */
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_gettimeofday, 8, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_time, 7, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clock_gettime, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_REALTIME, 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_REALTIME_COARSE, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_TAI, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
  };
  struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == -1)
    fprintf(stderr, "clockshift: no seccomp filter (%s): the program runs with its real clock\n", strerror(errno));
}

int main(int argc, char **argv) {
  if (argc < 4 || strcmp(argv[2], "--") != 0) {
    fprintf(stderr, "usage: clockshift OFFSET_SECONDS -- PROGRAM [ARG...]\n");
    return 125;
  }
  char *end;
  double offset = strtod(argv[1], &end);
  if (*end != '\0') {
    fprintf(stderr, "clockshift: not a number of seconds: %s\n", argv[1]);
    return 125;
  }
  offset_ns = (int64_t)(offset * 1e9);
  int go[2], ready[2];
  if (pipe(go) == -1 || pipe(ready) == -1) die("pipe");
  pid_t self = getpid();
  pid_t tracer = fork();
  if (tracer == -1) die("fork");
  if (tracer == 0) {
    /* The tracer: out of the program's process group (group signals reach the program alone); it ends with the
     * program (its parent), and the traced processes end with it (PTRACE_O_EXITKILL). */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    char byte;
    close(go[1]);
    close(ready[0]);
    if (read(go[0], &byte, 1) != 1) _exit(125);
    long options = PTRACE_O_TRACESECCOMP | PTRACE_O_TRACEEXEC | PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK |
                   PTRACE_O_TRACEVFORK | PTRACE_O_EXITKILL;
    byte = ptrace(PTRACE_SEIZE, self, 0, (void *)options) == 0 ? 'y' : 'n';
    if (write(ready[1], &byte, 1) != 1) _exit(125);
    if (byte != 'y') _exit(125);
    _exit(trace(self));
  }
  close(go[0]);
  close(ready[1]);
  prctl(PR_SET_PTRACER, tracer, 0, 0, 0); /* Yama: let the child trace its parent */
  char byte = 'g';
  if (write(go[1], &byte, 1) != 1) die("start the tracer");
  int attached = read(ready[0], &byte, 1) == 1 && byte == 'y';
  close(go[1]);
  close(ready[0]);
  if (attached) {
    filter();
  } else {
    /* ptrace refused (a sandbox's own seccomp, say): the program runs on the real clock, and the harness's check of
     * the role's clock (its Date header) shows the offset missing instead of a role that never started. */
    fprintf(stderr, "clockshift: cannot trace this process: %s runs with its real clock\n", argv[3]);
  }
  execvp(argv[3], argv + 3);
  die(argv[3]);
  return 125;
}
#endif
