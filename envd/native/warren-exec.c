/*
 * warren-exec: how envd starts every command in a sandbox. It sets the process limit (soft and hard: the user
 * cannot raise a hard limit), drops root to the user's uid, gid and supplementary groups, and execs the command,
 * in one exec instead of `prlimit` then `setpriv` (two dynamically linked programs: about 1.5 ms per command on
 * the machines Warren is measured on). Static, so it runs in any image whatever its libc; no name lookups (envd
 * passes numbers it read from /etc/passwd and /etc/group).
 *
 *   warren-exec [--nproc=N] [--uid=U --gid=G --groups=G1,G2,...] -- /absolute/command [args...]
 *
 * Exit status 126 (cannot execute) or 127 (not found, or bad usage), with a message on stderr, as a shell's.
 *
 *   warren-exec --serve
 *
 * envd's spawner: it forks every command envd starts, instead of envd (Node.js) forking itself. A fork copies the
 * forking process's page tables: from envd (40+ MiB resident) that took ~3 ms per command on the machines Warren is
 * measured on, from this program ~0.1 ms. The child then does what the launcher above does and execs the command
 * itself: one exec, none for the launcher. Requests come on stdin, one frame each: a 32-bit little-endian length,
 * then NUL-terminated fields:
 *   spawn, <id>, pipe|null (stdin), launch|exec|host, <cwd>, <argc>, <argv...>, <envc>, <env...>
 *       launch: argv is the launcher's (its own path, options, --, the command); exec: argv[0] is the file;
 *       host: as exec, for the node agent's host tools, which keep the spawner's OOM score (below)
 *   close, <id>           the spawner's copies of that spawn's pipe ends (envd has opened its own) are closed
 * Replies go to stdout, one line each:
 *   S <id> <pid> <stdin fd|-1> <stdout fd> <stderr fd> <in workload 0|1>
 *                                                        started; envd opens /proc/<spawner>/fd/<fd> for its ends
 *   E <id> <errno>                                       could not start (no pipes or no fork)
 *   X <pid> <wait status>                                the child ended (after its S)
 * The command leads its own session; its signals are the defaults, its mask empty, its oom_score_adj 1000 (the
 * OOM killer takes it before envd) but in host mode. A spawner given the sandbox's workload cgroup
 * (`--serve-beside --workload-fd=N`) has each command's child join it before it execs (`1` in its S line): the
 * command and everything it forks run inside from their first instruction, and envd moves nothing afterwards
 * (a cgroup write and a walk of /proc on its event loop per command, platform/src/workload.ts). The spawner ends when envd closes its stdin (SIGTERM, SIGINT
 * and SIGHUP do not end it); its children run on. The node agent runs one too, for its host tools (control-plane/src/runtime/exec.ts).
 *
 *   warren-exec --serve-beside [--workload-fd=N] -- /absolute/program [args...]
 *
 * How a sandbox starts envd: the spawner is forked from this small process before envd exists, and this process
 * then execs envd (same pid, same descriptors) with WARREN_SPAWNER=<spawner pid>:<request fd>:<reply fd> naming its
 * ends of the spawner's stdin and stdout. envd (platform/src/spawner.ts) adopts them instead of spawning the
 * spawner itself: a fork of a fresh Node.js process cost ~8 ms of envd's start on the machines Warren is measured
 * on. The spawner is envd's child as before, and ends when envd's end of its stdin closes.
 *
 *   warren-exec --launch-sandbox <instance dir>
 *
 * The node agent's launch of a sandbox whose disk is ready (control-plane/src/runtime/namespace/instance-container.ts,
 * whose shell launcher does the same and more): output to <dir>/envd.log; the ready disk at $DISK_READY moved to
 * <dir>/disk (bound, then unmounted, where a shared parent refuses the move); the overlay of $LOWER under that
 * disk's upper and work dirs at <dir>/rootfs; this process into every cgroup.procs in $CGROUP_PROCS; the workload's
 * cgroup.procs ($WORKLOAD_PROCS, appended) as fd 3 and its memory.oom_control ($WORKLOAD_OOM_CONTROL) as fd 4; then
 * `crun run --detach` of <dir>/bundle as container $CID under $CRUN_ROOT. Mounts by system call instead of a shell
 * and two `mount` execs: ~15 ms of CPU per cold start on the machines Warren is measured on. Without a ready disk
 * ($DISK_TEMPLATE instead of $DISK_READY) it first makes one at <dir>/disk from <dir>/disk.img, as below.
 *
 *   warren-exec --netns-setup <network namespace path>      (the rules on stdin)
 *
 * A new sandbox network's own side (control-plane/src/runtime/namespace/network.ts, whose NAMESPACE_SETUP shell
 * does the same under nsenter): joins the namespace, writes its settings (IPv6 off, every port and ping for
 * everyone, non-local binds), then execs `iptables-restore` with the rules: two execs fewer than nsenter + sh.
 *
 *   warren-exec --ready-disk <formatted image> <new image> <mount point>
 *
 * A sandbox disk (control-plane/src/runtime/namespace/sandbox-disks.ts, whose MAKE_DISK shell does the same): a
 * sparse copy of the formatted image (only its data extents), on a loop device with direct I/O that frees itself at
 * the unmount (LOOP_CONFIGURE with AUTOCLEAR), mounted nodev,noatime,noinit_itable: one exec instead of `cp`,
 * `losetup`, `mount` and `losetup -d`. Status 126 with a message when a step fails (nothing left mounted).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/loop.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_GROUPS 256

static void fail(int status, const char *what, const char *detail) {
  fprintf(stderr, "warren-exec: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(status);
}

/* A decimal number that fits an unsigned int; anything else is a usage error naming the option. */
static unsigned int number(const char *text, const char *option) {
  char *end = NULL;
  errno = 0;
  unsigned long value = strtoul(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || value > UINT_MAX) {
    fail(127, "not a number", option);
  }
  return (unsigned int)value;
}

/* What the launcher's options ask for. */
struct launch {
  long nproc, uid, gid;
  gid_t groups[MAX_GROUPS];
  int ngroups;
};

/* Parses the options before `--`; returns the index of the command in argv. Usage errors exit 127. */
static int parse_options(int argc, char **argv, struct launch *l) {
  l->nproc = -1;
  l->uid = -1;
  l->gid = -1;
  l->ngroups = -1;
  int i = 1;
  for (; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (strncmp(arg, "--nproc=", 8) == 0) {
      l->nproc = number(arg + 8, "--nproc");
    } else if (strncmp(arg, "--uid=", 6) == 0) {
      l->uid = number(arg + 6, "--uid");
    } else if (strncmp(arg, "--gid=", 6) == 0) {
      l->gid = number(arg + 6, "--gid");
    } else if (strncmp(arg, "--groups=", 9) == 0) {
      l->ngroups = 0;
      char *list = strdup(arg + 9);
      if (list == NULL) fail(127, "out of memory", NULL);
      for (char *item = strtok(list, ","); item != NULL; item = strtok(NULL, ",")) {
        if (l->ngroups == MAX_GROUPS) fail(127, "too many groups", NULL);
        l->groups[l->ngroups++] = number(item, "--groups");
      }
      free(list);
    } else {
      fail(127, "unknown option", arg);
    }
  }
  if (i >= argc) fail(127, "no command after --", NULL);
  if ((l->uid >= 0) != (l->gid >= 0) || (l->uid >= 0) != (l->ngroups >= 0)) {
    fail(127, "--uid, --gid and --groups go together", NULL);
  }
  return i;
}

/* Sets the limit, then drops to the user; exits 127 when the kernel refuses. */
static void apply(const struct launch *l) {
  if (l->nproc >= 0) {
    struct rlimit limit = {.rlim_cur = (rlim_t)l->nproc, .rlim_max = (rlim_t)l->nproc};
    if (setrlimit(RLIMIT_NPROC, &limit) != 0) fail(127, "cannot set the process limit", strerror(errno));
  }
  if (l->uid >= 0) {
    /* Groups first, while still root; the uid last, so nothing can be regained. */
    if (setgroups((size_t)l->ngroups, l->groups) != 0) fail(127, "cannot set the groups", strerror(errno));
    if (setresgid((gid_t)l->gid, (gid_t)l->gid, (gid_t)l->gid) != 0) fail(127, "cannot set the gid", strerror(errno));
    if (setresuid((uid_t)l->uid, (uid_t)l->uid, (uid_t)l->uid) != 0) fail(127, "cannot set the uid", strerror(errno));
  }
}

/* Execs argv[0] with envp (the caller's environment when NULL); returns only to exit 126/127 with a message. */
static void exec_or_fail(char **argv, char **envp) {
  if (envp != NULL) {
    execve(argv[0], argv, envp);
  } else {
    execv(argv[0], argv);
  }
  int error = errno;
  char message[PATH_MAX + 64];
  snprintf(message, sizeof message, "%s: %s", argv[0], strerror(error));
  fail(error == ENOENT ? 127 : 126, "cannot execute", message);
}

/* ---- --serve ---- */

#define MAX_FRAME (64u << 20)

/* A started command whose pipe ends the spawner still holds, until envd's `close`. */
struct held {
  char id[32];
  int fds[3];
};

static struct held *helds;
static size_t nhelds, caphelds;

/* The workload cgroup's cgroup.procs (close-on-exec) that commands join before they exec; -1: none. */
static int workload_fd = -1;

static void write_all(const char *text, size_t length) {
  while (length > 0) {
    ssize_t n = write(1, text, length);
    if (n < 0) {
      if (errno == EINTR) continue;
      _exit(0); /* envd is gone */
    }
    text += n;
    length -= (size_t)n;
  }
}

static void reply(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *format, ...) {
  char line[128];
  va_list args;
  va_start(args, format);
  int n = vsnprintf(line, sizeof line, format, args);
  va_end(args);
  if (n > 0) write_all(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void close_held(const char *id) {
  for (size_t i = 0; i < nhelds; i++) {
    if (strcmp(helds[i].id, id) != 0) continue;
    for (int k = 0; k < 3; k++) {
      if (helds[i].fds[k] >= 0) close(helds[i].fds[k]);
    }
    helds[i] = helds[--nhelds];
    return;
  }
}

static void hold(const char *id, int in, int out, int err) {
  if (nhelds == caphelds) {
    caphelds = caphelds ? caphelds * 2 : 16;
    helds = realloc(helds, caphelds * sizeof *helds);
    if (helds == NULL) _exit(70);
  }
  struct held *h = &helds[nhelds++];
  snprintf(h->id, sizeof h->id, "%s", id);
  h->fds[0] = in;
  h->fds[1] = out;
  h->fds[2] = err;
}

/* In the forked child: a fresh process's signal state, its own session, the pipes as 0-2, then the command. */
static void become(char *cwd, int in, int out, int err, int launch, int host, int argc, char **argv, char **envp) {
  /* First, while fd 2 is still the sandbox's log: "0" is the writing process. A failure is not fatal (the command
   * then runs in the sandbox's own cgroup, under its limits) but is logged. */
  if (!host && workload_fd >= 0 && write(workload_fd, "0\n", 2) != 2) {
    fprintf(stderr, "warren-exec: a command could not join the workload cgroup: %s\n", strerror(errno));
  }
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  setsid();
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(127);
  int oom = host ? -1 : open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    if (write(oom, "1000", 4) < 0) {
      /* Not fatal: the OOM killer may then pick envd's processes first, as before envd set it at all. */
    }
    close(oom);
  }
  if (chdir(cwd) != 0) fail(127, "cannot change to the working directory", strerror(errno));
  if (launch) {
    struct launch l;
    int command = parse_options(argc, argv, &l);
    apply(&l);
    exec_or_fail(argv + command, envp);
  }
  exec_or_fail(argv, envp);
}

/* The next NUL-terminated field of a frame, or NULL when the frame has no more. */
static char *field(char **cursor, char *end) {
  if (*cursor >= end) return NULL;
  char *start = *cursor;
  char *nul = memchr(start, '\0', (size_t)(end - start));
  if (nul == NULL) return NULL;
  *cursor = nul + 1;
  return start;
}

static int count(char **cursor, char *end, long max) {
  char *text = field(cursor, end);
  if (text == NULL) return -1;
  char *stop = NULL;
  long value = strtol(text, &stop, 10);
  return (*stop != '\0' || value < 0 || value > max) ? -1 : (int)value;
}

/* Reads `n` fields into a NULL-terminated array (malloc'd; freed by the caller or the exec). */
static char **fields(char **cursor, char *end, int n) {
  char **list = calloc((size_t)n + 1, sizeof *list);
  if (list == NULL) return NULL;
  for (int i = 0; i < n; i++) {
    list[i] = field(cursor, end);
    if (list[i] == NULL) {
      free(list);
      return NULL;
    }
  }
  return list;
}

static void spawn_request(char *cursor, char *end) {
  char *id = field(&cursor, end);
  char *stdin_mode = field(&cursor, end);
  char *mode = field(&cursor, end);
  char *cwd = field(&cursor, end);
  int argc = count(&cursor, end, 1 << 20);
  char **argv = argc > 0 ? fields(&cursor, end, argc) : NULL;
  int envc = argv ? count(&cursor, end, 1 << 20) : -1;
  char **envp = envc >= 0 ? fields(&cursor, end, envc) : NULL;
  if (id == NULL || stdin_mode == NULL || mode == NULL || cwd == NULL || envp == NULL) {
    reply("E %s %d\n", id ? id : "?", EINVAL);
    free(argv);
    return;
  }
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  int ok = pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0;
  if (ok) {
    ok = strcmp(stdin_mode, "pipe") == 0 ? pipe2(in, O_CLOEXEC) == 0
                                          : (in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;
  }
  pid_t pid = ok ? fork() : -1;
  if (pid == 0) {
    become(cwd, in[0], out[1], err[1], strcmp(mode, "launch") == 0, strcmp(mode, "host") == 0, argc, argv, envp);
  }
  int error = errno;
  int ends[] = {in[0], out[1], err[1]};
  for (int k = 0; k < 3; k++) {
    if (ends[k] >= 0) close(ends[k]);
  }
  if (pid < 0) {
    int mine[] = {in[1], out[0], err[0]};
    for (int k = 0; k < 3; k++) {
      if (mine[k] >= 0) close(mine[k]);
    }
    reply("E %s %d\n", id, error);
  } else {
    hold(id, in[1], out[0], err[0]);
    int joins = workload_fd >= 0 && strcmp(mode, "host") != 0;
    reply("S %s %d %d %d %d %d\n", id, (int)pid, in[1], out[0], err[0], joins);
  }
  free(argv);
  free(envp);
}

static void handle(char *frame, size_t length) {
  char *cursor = frame, *end = frame + length;
  char *verb = field(&cursor, end);
  if (verb != NULL && strcmp(verb, "spawn") == 0) {
    spawn_request(cursor, end);
  } else if (verb != NULL && strcmp(verb, "close") == 0) {
    char *id = field(&cursor, end);
    if (id != NULL) close_held(id);
  }
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) reply("X %d %d\n", (int)pid, status);
}

static int serve(void) {
  signal(SIGPIPE, SIG_IGN);
  /* It ends when its user closes its stdin (or dies), never on a signal sent to the user's whole process group:
   * a node agent stopping on SIGTERM still runs its teardown's tools through it. Children reset these. */
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) fail(70, "signalfd", strerror(errno));
  size_t cap = 1 << 16, used = 0;
  char *buffer = malloc(cap);
  if (buffer == NULL) return 70;
  for (;;) {
    struct pollfd fds[] = {{.fd = 0, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 70;
    }
    if (fds[1].revents & POLLIN) {
      struct signalfd_siginfo info;
      while (read(sfd, &info, sizeof info) == sizeof info) {
      }
      reap();
    }
    if (fds[0].revents & (POLLIN | POLLHUP)) {
      if (cap - used < 4096) {
        cap *= 2;
        buffer = realloc(buffer, cap);
        if (buffer == NULL) return 70;
      }
      ssize_t n = read(0, buffer + used, cap - used);
      if (n == 0) return 0; /* envd closed its end: done */
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return 70;
      }
      used += (size_t)n;
      for (;;) {
        if (used < 4) break;
        uint32_t length = (uint32_t)(unsigned char)buffer[0] | (uint32_t)(unsigned char)buffer[1] << 8 |
                          (uint32_t)(unsigned char)buffer[2] << 16 | (uint32_t)(unsigned char)buffer[3] << 24;
        if (length > MAX_FRAME) fail(70, "frame too large", NULL);
        if (used < 4 + (size_t)length) {
          if (cap < 4 + (size_t)length) {
            cap = 4 + (size_t)length;
            buffer = realloc(buffer, cap);
            if (buffer == NULL) return 70;
          }
          break;
        }
        handle(buffer + 4, length);
        memmove(buffer, buffer + 4 + length, used - 4 - length);
        used -= 4 + length;
      }
    }
  }
}

/* --serve-beside: the spawner in a child, the program in this process (see the top of this file). */
static int serve_beside(int argc, char **argv) {
  int workload = -1, first = 2;
  if (strncmp(argv[2], "--workload-fd=", 14) == 0) {
    workload = (int)number(argv[2] + 14, "--workload-fd");
    /* 0-2 become the spawner's pipes and its log: a workload descriptor is one the program was handed beside them. */
    if (workload < 3) fail(127, "--workload-fd must be 3 or more", NULL);
    if (fcntl(workload, F_GETFD) < 0) fail(126, "--workload-fd", strerror(errno));
    first = 3;
  }
  if (argc < first + 2 || strcmp(argv[first], "--") != 0 || argv[first + 1][0] != '/') {
    fail(127, "usage: warren-exec --serve-beside [--workload-fd=N] -- /absolute/program [args...]", NULL);
  }
  char **program = argv + first + 1;
  int requests[2], replies[2];
  if (pipe2(requests, O_CLOEXEC) != 0 || pipe2(replies, O_CLOEXEC) != 0) fail(126, "pipe", strerror(errno));
  pid_t spawner = fork();
  if (spawner < 0) fail(126, "fork", strerror(errno));
  if (spawner == 0) {
    /* dup2 clears O_CLOEXEC on 0 and 1; the other ends close with the spawner's children's exec. */
    if (dup2(requests[0], 0) < 0 || dup2(replies[1], 1) < 0) _exit(70);
    /* The workload's cgroup.procs as fd 3, close-on-exec: the children join it, the commands never inherit it. */
    int keep = 3;
    if (workload >= 0) {
      if (workload == 3 ? fcntl(3, F_SETFD, FD_CLOEXEC) != 0 : dup3(workload, 3, O_CLOEXEC) < 0) _exit(70);
      workload_fd = 3;
      keep = 4;
    }
    /* Nothing else the sandbox's init handed down (the workload's OOM count is envd's): only 0-2 (and 3). */
    if (close_range((unsigned int)keep, ~0U, 0) != 0) {
      for (int fd = keep; fd < 1024; fd++) close(fd);
    }
    /* Its command line says what it is (`warren-exec --serve-beside`), not envd's: a search for envd finds envd. */
    for (int i = 2; i < argc; i++) memset(argv[i], 0, strlen(argv[i]));
    _exit(serve());
  }
  close(requests[0]);
  close(replies[1]);
  /* The program's ends survive its exec. */
  if (fcntl(requests[1], F_SETFD, 0) != 0 || fcntl(replies[0], F_SETFD, 0) != 0) fail(126, "fcntl", strerror(errno));
  char value[64];
  snprintf(value, sizeof value, "%d:%d:%d", (int)spawner, requests[1], replies[0]);
  if (setenv("WARREN_SPAWNER", value, 1) != 0) fail(126, "setenv", strerror(errno));
  execv(program[0], program);
  fail(errno == ENOENT ? 127 : 126, program[0], strerror(errno));
  return 127;
}

/* --netns-setup */

static void write_setting(const char *path, const char *value) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  size_t length = strlen(value);
  if (fd < 0 || write(fd, value, length) != (ssize_t)length) fail(126, path, strerror(errno));
  close(fd);
}

static int netns_setup(const char *netns) {
  int fd = open(netns, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) fail(126, netns, strerror(errno));
  close(fd);
  /* /proc/sys/net is the namespace of the process that opens it: this one's, from here on. */
  write_setting("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1");
  write_setting("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
  write_setting("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0");
  write_setting("/proc/sys/net/ipv4/ping_group_range", "0 2147483647");
  write_setting("/proc/sys/net/ipv4/ip_nonlocal_bind", "1");
  char *restore[] = {"iptables-restore", NULL};
  execvp("iptables-restore", restore);
  fail(errno == ENOENT ? 127 : 126, "iptables-restore", strerror(errno));
  return 127;
}

/* --ready-disk */

/* A sparse copy: the same size, only the source's data extents written. */
static void sparse_copy(const char *from, const char *to) {
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0) fail(126, from, strerror(errno));
  struct stat st;
  if (fstat(in, &st) != 0) fail(126, from, strerror(errno));
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 0777);
  if (out < 0) fail(126, to, strerror(errno));
  if (ftruncate(out, st.st_size) != 0) fail(126, to, strerror(errno));
  off_t data = 0;
  for (;;) {
    data = lseek(in, data, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break; /* no data past here */
      fail(126, from, strerror(errno));
    }
    off_t hole = lseek(in, data, SEEK_HOLE);
    if (hole < 0) fail(126, from, strerror(errno));
    off_t at = data;
    while (at < hole) {
      off_t dst = at;
      ssize_t n = copy_file_range(in, &at, out, &dst, (size_t)(hole - at), 0);
      if (n <= 0) fail(126, to, n < 0 ? strerror(errno) : "short copy");
    }
    data = hole;
  }
  if (close(out) != 0) fail(126, to, strerror(errno));
  close(in);
}

static void make_disk(const char *formatted, const char *image, const char *mnt) {
  sparse_copy(formatted, image);
  int file = open(image, O_RDWR | O_CLOEXEC);
  int control = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (file < 0 || control < 0) fail(126, "loop device", strerror(errno));
  struct loop_config config;
  memset(&config, 0, sizeof config);
  config.fd = (unsigned int)file;
  config.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
  snprintf((char *)config.info.lo_file_name, sizeof config.info.lo_file_name, "%s", image);
  char device[64];
  int loop = -1;
  /* Another process may take the free device between the two calls: ask again. */
  for (int attempt = 0; attempt < 64 && loop < 0; attempt++) {
    int n = ioctl(control, LOOP_CTL_GET_FREE);
    if (n < 0) fail(126, "LOOP_CTL_GET_FREE", strerror(errno));
    snprintf(device, sizeof device, "/dev/loop%d", n);
    loop = open(device, O_RDWR | O_CLOEXEC);
    if (loop < 0) fail(126, device, strerror(errno));
    if (ioctl(loop, LOOP_CONFIGURE, &config) != 0) {
      int error = errno;
      close(loop);
      loop = -1;
      if (error != EBUSY) fail(126, "LOOP_CONFIGURE", strerror(error));
    }
  }
  if (loop < 0) fail(126, "no free loop device", NULL);
  /* AUTOCLEAR: the device frees itself once unmounted and closed (at once, if the mount fails). */
  if (mount(device, mnt, "ext4", MS_NODEV | MS_NOATIME, "noinit_itable") != 0) fail(126, "mount", strerror(errno));
  close(loop);
  close(file);
  close(control);
}

/* --launch-sandbox */

static const char *need_env(const char *name) {
  const char *value = getenv(name);
  if (value == NULL || value[0] == '\0') fail(127, "missing environment variable", name);
  return value;
}

static void path_in(char *out, size_t size, const char *dir, const char *name) {
  if ((size_t)snprintf(out, size, "%s/%s", dir, name) >= size) fail(127, "path too long", dir);
}

static int launch_sandbox(const char *dir) {
  char path[PATH_MAX], disk[PATH_MAX], rootfs[PATH_MAX];
  path_in(path, sizeof path, dir, "envd.log");
  int log = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (log < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0) fail(126, "envd.log", strerror(errno));
  path_in(disk, sizeof disk, dir, "disk");
  path_in(rootfs, sizeof rootfs, dir, "rootfs");
  const char *ready = getenv("DISK_READY");
  if (ready != NULL && ready[0] != '\0') {
    if (mount(ready, disk, NULL, MS_MOVE, NULL) != 0) {
      if (mount(ready, disk, NULL, MS_BIND, NULL) != 0) fail(126, "bind the ready disk", strerror(errno));
      if (umount2(ready, 0) != 0) fail(126, "unmount the ready disk", strerror(errno));
    }
  } else {
    char image[PATH_MAX];
    path_in(image, sizeof image, dir, "disk.img");
    make_disk(need_env("DISK_TEMPLATE"), image, disk);
  }
  static char options[4096];
  if ((size_t)snprintf(options, sizeof options, "lowerdir=%s,upperdir=%s/upper,workdir=%s/work", need_env("LOWER"),
                       disk, disk) >= sizeof options)
    fail(127, "overlay options too long", NULL);
  if (mount("warren-root", rootfs, "overlay", 0, options) != 0) fail(126, "mount the overlay root", strerror(errno));
  char pid[32];
  int pid_length = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
  char *procs = strdup(need_env("CGROUP_PROCS"));
  for (char *file = strtok(procs, " "); file != NULL; file = strtok(NULL, " ")) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, pid, (size_t)pid_length) != pid_length) fail(126, file, strerror(errno));
    close(fd);
  }
  int procs_fd = open(need_env("WORKLOAD_PROCS"), O_WRONLY | O_APPEND);
  int oom_fd = open(need_env("WORKLOAD_OOM_CONTROL"), O_RDONLY);
  if (procs_fd < 0 || oom_fd < 0) fail(126, "workload cgroup", strerror(errno));
  if (dup2(procs_fd, 3) < 0 || dup2(oom_fd, 4) < 0) fail(126, "dup2", strerror(errno));
  if (procs_fd > 4) close(procs_fd);
  if (oom_fd > 4) close(oom_fd);
  char bundle[PATH_MAX], pid_file[PATH_MAX];
  path_in(bundle, sizeof bundle, dir, "bundle");
  path_in(pid_file, sizeof pid_file, dir, "pid");
  char *crun[] = {"crun", "--root", (char *)need_env("CRUN_ROOT"), "--cgroup-manager=disabled", "run",
                  "--preserve-fds", "2", "--detach", "--bundle", bundle, "--pid-file", pid_file,
                  (char *)need_env("CID"), NULL};
  execvp("crun", crun);
  fail(errno == ENOENT ? 127 : 126, "crun", strerror(errno));
  return 127;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--launch-sandbox") == 0 && argv[2][0] == '/') return launch_sandbox(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--netns-setup") == 0) return netns_setup(argv[2]);
  if (argc == 5 && strcmp(argv[1], "--ready-disk") == 0) {
    make_disk(argv[2], argv[3], argv[4]);
    return 0;
  }
  if (argc == 2 && strcmp(argv[1], "--serve") == 0) return serve();
  if (argc >= 4 && strcmp(argv[1], "--serve-beside") == 0) return serve_beside(argc, argv);
  struct launch l;
  int command = parse_options(argc, argv, &l);
  apply(&l);
  exec_or_fail(argv + command, NULL);
  return 127;
}
