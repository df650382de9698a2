/* What a stage's cgroup adds to one spawn of /bin/true, as orchestrate spawns a stage:
 * clone3(CLONE_VFORK) then execve and a wait, in three forms alternated:
 *   plain      the child stays in this process's cgroup;
 *   cgroup     CLONE_INTO_CGROUP into an empty cgroup v2 made for the probe (the stage's
 *              cgroup, reused from stage to stage as orchestrate reuses one);
 *   cgroup+ns  the same, and the child unshares a cgroup namespace before execve (what
 *              each stage gets where the kernel allows it).
 *
 *   cc -O2 -o /tmp/cgroup_spawn bench/overhead/cgroup_spawn.c   (with spawn_probe.h beside it)
 *   /tmp/cgroup_spawn CGROUP_V2_DIR [SPAWNS] [REPS]
 *
 * CGROUP_V2_DIR: a delegated cgroup v2 directory (e.g. /sys/fs/cgroup/unified on a hybrid
 * host, /sys/fs/cgroup on a v2-only one); the probe makes and removes "cgroup-spawn-probe" in it.
 * Prints one JSON object: microseconds per spawn (median, min, max over REPS rounds of
 * SPAWNS spawns each). Wall time: run it on an otherwise quiet machine.
 */
#include "spawn_probe.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* The cgroup namespace of form 2, made in the child before execve. */
static int own_cgroup_namespace(void) { return unshare(CLONE_NEWCGROUP); }

/* One spawn in form `form` (0 plain, 1 cgroup, 2 cgroup+ns); 0 when /bin/true exited 0. */
static int spawn(int form, int cgroup_fd) {
    return spawn_true(form ? CLONE_INTO_CGROUP : 0, cgroup_fd,
                      form == 2 ? own_cgroup_namespace : NULL);
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
    for (int f = 0; f < 3; f++)
        print_summary(names[f], us[f], reps, f == 0);
    printf("}}\n");
    return 0;
}
