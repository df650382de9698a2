/* What a stage's cgroup adds to one spawn of /bin/true, as orchestrate spawns a stage:
 * clone3(CLONE_VFORK) then execve and a wait, in three forms alternated:
 *   plain      the child stays in this process's cgroup;
 *   cgroup     CLONE_INTO_CGROUP into an empty cgroup v2 made for the probe (the stage's
 *              cgroup, reused from stage to stage as orchestrate reuses one);
 *   cgroup+ns  the same, and the child unshares a cgroup namespace before execve (what
 *              each stage gets where the kernel allows it).
 *
 *   cc -O2 -o /tmp/cgroup_spawn bench/overhead/cgroup_spawn.c
 *   /tmp/cgroup_spawn CGROUP_V2_DIR [SPAWNS] [REPS]
 *
 * CGROUP_V2_DIR: a delegated cgroup v2 directory (e.g. /sys/fs/cgroup/unified on a hybrid
 * host, /sys/fs/cgroup on a v2-only one); the probe makes and removes "cgroup-spawn-probe" in it.
 * Prints one JSON object: microseconds per spawn (median, min, max over REPS rounds of
 * SPAWNS spawns each). Wall time: run it on an otherwise quiet machine.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One spawn in form `form` (0 plain, 1 cgroup, 2 cgroup+ns); 0 when /bin/true exited 0. */
static int spawn(int form, int cgroup_fd) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    /* Without CLONE_VM the child returns from the system call on a copy of this small
     * process's memory; the parent still waits until its execve (CLONE_VFORK). */
    args.flags = CLONE_VFORK | (form ? CLONE_INTO_CGROUP : 0);
    args.exit_signal = SIGCHLD;
    args.cgroup = (unsigned long)cgroup_fd;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
        if (form == 2 && unshare(CLONE_NEWCGROUP) != 0)
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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CGROUP_V2_DIR [SPAWNS] [REPS]\n", argv[0]);
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 1000;
    int reps = argc > 3 ? atoi(argv[3]) : 9;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/cgroup-spawn-probe", argv[1]);
    if (mkdir(dir, 0755) != 0) {
        perror(dir);
        return 1;
    }
    int cgroup_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cgroup_fd < 0) {
        perror(dir);
        rmdir(dir);
        return 1;
    }
    double *us[3];
    for (int f = 0; f < 3; f++)
        us[f] = calloc((size_t)reps, sizeof(double));
    int failed = 0;
    for (int r = 0; r < reps && !failed; r++) {
        for (int f = 0; f < 3 && !failed; f++) {
            double t0 = now();
            for (int i = 0; i < n; i++) {
                if (spawn(f, cgroup_fd) != 0) {
                    fprintf(stderr, "form %d: spawn failed\n", f);
                    failed = 1;
                    break;
                }
            }
            us[f][r] = (now() - t0) * 1e6 / n;
        }
    }
    close(cgroup_fd);
    rmdir(dir);
    if (failed)
        return 1;
    const char *names[3] = {"plain", "cgroup", "cgroup+ns"};
    printf("{\"spawns\": %d, \"reps\": %d, \"us_per_spawn\": {", n, reps);
    for (int f = 0; f < 3; f++) {
        qsort(us[f], (size_t)reps, sizeof(double), cmp);
        printf("%s\"%s\": {\"median\": %.1f, \"min\": %.1f, \"max\": %.1f}", f ? ", " : "",
               names[f], us[f][reps / 2], us[f][0], us[f][reps - 1]);
    }
    printf("}}\n");
    return 0;
}
