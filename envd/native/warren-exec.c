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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

int main(int argc, char **argv) {
  long nproc = -1, uid = -1, gid = -1;
  gid_t groups[MAX_GROUPS];
  int ngroups = -1;
  int i = 1;
  for (; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (strncmp(arg, "--nproc=", 8) == 0) {
      nproc = number(arg + 8, "--nproc");
    } else if (strncmp(arg, "--uid=", 6) == 0) {
      uid = number(arg + 6, "--uid");
    } else if (strncmp(arg, "--gid=", 6) == 0) {
      gid = number(arg + 6, "--gid");
    } else if (strncmp(arg, "--groups=", 9) == 0) {
      ngroups = 0;
      char *list = strdup(arg + 9);
      if (list == NULL) fail(127, "out of memory", NULL);
      for (char *item = strtok(list, ","); item != NULL; item = strtok(NULL, ",")) {
        if (ngroups == MAX_GROUPS) fail(127, "too many groups", NULL);
        groups[ngroups++] = number(item, "--groups");
      }
      free(list);
    } else {
      fail(127, "unknown option", arg);
    }
  }
  if (i >= argc) fail(127, "no command after --", NULL);
  if ((uid >= 0) != (gid >= 0) || (uid >= 0) != (ngroups >= 0)) {
    fail(127, "--uid, --gid and --groups go together", NULL);
  }

  if (nproc >= 0) {
    struct rlimit limit = {.rlim_cur = (rlim_t)nproc, .rlim_max = (rlim_t)nproc};
    if (setrlimit(RLIMIT_NPROC, &limit) != 0) fail(127, "cannot set the process limit", strerror(errno));
  }
  if (uid >= 0) {
    /* Groups first, while still root; the uid last, so nothing can be regained. */
    if (setgroups((size_t)ngroups, groups) != 0) fail(127, "cannot set the groups", strerror(errno));
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) fail(127, "cannot set the gid", strerror(errno));
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) fail(127, "cannot set the uid", strerror(errno));
  }
  execv(argv[i], argv + i);
  int error = errno;
  char message[PATH_MAX + 64];
  snprintf(message, sizeof message, "%s: %s", argv[i], strerror(error));
  fail(error == ENOENT ? 127 : 126, "cannot execute", message);
  return 127;
}
