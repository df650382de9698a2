/* What a stage's own session costs one spawn of /bin/true: clone3(CLONE_VFORK), then in the
 * child nothing, setsid() (what orchestrate does for every stage) or setpgid(0, 0) (a process
 * group of its own in the parent's session), then execve and a wait. Forms alternated.
 *
 *   cc -O2 -o /tmp/session_spawn bench/overhead/session_spawn.c   (with spawn_probe.h beside it)
 *   /tmp/session_spawn [SPAWNS] [REPS]
 *
 * Where the kernel has CONFIG_SCHED_AUTOGROUP, every setsid() makes a new autogroup, and with
 * kernel.sched_autogroup_enabled = 1 a process outside any CPU cgroup is scheduled in it.
 * Prints one JSON object: per spawn, the wall and the CPU time of this process and its
 * children (getrusage), microseconds, median and range over REPS rounds; and the sysctl.
 */
#include "spawn_probe.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#define FORMS 3
#define MAX_REPS 64

static double seconds(struct timeval t) { return t.tv_sec + t.tv_usec * 1e-6; }

/* CPU seconds of this process and of its reaped children. */
static double cpu(void) {
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    return seconds(self.ru_utime) + seconds(self.ru_stime) + seconds(children.ru_utime) +
           seconds(children.ru_stime);
}

static int own_session(void) { return setsid() < 0; }
static int own_group(void) { return setpgid(0, 0); }

/* One spawn in form `form` (0 nothing, 1 setsid, 2 setpgid); 0 when /bin/true exited 0. */
static int spawn(int form) {
    return spawn_true(0, -1, form == 1 ? own_session : form == 2 ? own_group : NULL);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "REPS: 1 to %d\n", MAX_REPS);
        return 2;
    }
    static double wall[FORMS][MAX_REPS], used[FORMS][MAX_REPS];
    for (int r = 0; r < reps; r++) {
        for (int f = 0; f < FORMS; f++) {
            double t0 = now(), c0 = cpu();
            for (int i = 0; i < n; i++) {
                if (spawn(f) != 0) {
                    fprintf(stderr, "form %d: spawn failed\n", f);
                    return 1;
                }
            }
            wall[f][r] = (now() - t0) * 1e6 / n;
            used[f][r] = (cpu() - c0) * 1e6 / n;
        }
    }
    int autogroup = -1;
    FILE *sysctl = fopen("/proc/sys/kernel/sched_autogroup_enabled", "r");
    if (sysctl) {
        if (fscanf(sysctl, "%d", &autogroup) != 1)
            autogroup = -1;
        fclose(sysctl);
    }
    const char *names[FORMS] = {"plain", "setsid", "setpgid"};
    printf("{\"spawns\": %d, \"reps\": %d, \"sched_autogroup_enabled\": %d, \"wall_us\": {", n,
           reps, autogroup);
    for (int f = 0; f < FORMS; f++)
        print_summary(names[f], wall[f], reps, f == 0);
    printf("}, \"cpu_us\": {");
    for (int f = 0; f < FORMS; f++)
        print_summary(names[f], used[f], reps, f == 0);
    printf("}}\n");
    return 0;
}
