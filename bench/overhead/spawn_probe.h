/* What the spawn probes (cgroup_spawn.c, session_spawn.c, held_spawn.c) share: a clock, the
 * summary each prints of a form's rounds, and one spawn of /bin/true as `orchestrate` spawns a
 * stage: clone3(CLONE_VFORK | extra flags), an optional step in the child before execve, then
 * a wait. Header-only: each probe is still built with one `cc` command. */
#ifndef SPAWN_PROBE_H
#define SPAWN_PROBE_H

#define _GNU_SOURCE
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Monotonic seconds. */
static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* qsort order of doubles. */
static inline int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Prints `"name": {"median": …, "min": …, "max": …}` of the `reps` values `v` (sorted in
 * place; the median of an even count is the mean of the middle two), after ", " unless
 * `first`. */
static inline void print_summary(const char *name, double *v, int reps, int first) {
    qsort(v, (size_t)reps, sizeof(double), cmp);
    double median = reps % 2 ? v[reps / 2] : (v[reps / 2 - 1] + v[reps / 2]) / 2;
    printf("%s\"%s\": {\"median\": %.1f, \"min\": %.1f, \"max\": %.1f}", first ? "" : ", ",
           name, median, v[0], v[reps - 1]);
}

/* One spawn of /bin/true: clone3 with CLONE_VFORK and `flags` (with CLONE_INTO_CGROUP,
 * `cgroup_fd` is the cgroup), then in the child `before_exec` when given (a non-zero return
 * ends the child with 126) and execve. Without CLONE_VM the child returns from the system call
 * on a copy of this small process's memory; the parent still waits until its execve.
 * The child's wait status (0 when /bin/true exited 0), or -1 when the spawn failed. */
static inline int spawn_true(unsigned long long flags, int cgroup_fd, int (*before_exec)(void)) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_VFORK | flags;
    args.exit_signal = SIGCHLD;
    args.cgroup = (unsigned long long)(cgroup_fd < 0 ? 0 : cgroup_fd);
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
        if (before_exec && before_exec() != 0)
            _exit(126);
        char *argv[] = {"true", NULL};
        execve("/bin/true", argv, environ);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    int status;
    if (waitpid((pid_t)pid, &status, 0) < 0)
        return -1;
    return status;
}

#endif
