/* Would a chain's next stage start sooner if its process were cloned ahead and only released
 * to execve when the stage before it ends? Two forms of a chain of /usr/bin/true, alternated:
 *   vfork  as orchestrate spawns a stage: clone(CLONE_VM | CLONE_VFORK), the child execs at
 *          once, the parent waits for it to exit, then clones the next;
 *   held   the next child is cloned (CLONE_VM without CLONE_VFORK, on its own stack) while the
 *          current one runs; it blocks on a pipe, and the parent releases it with one byte the
 *          moment the current one has been reaped (the clone is off the path between stages).
 * Both children set up a session and PR_SET_PDEATHSIG as a stage does.
 *
 *   cc -O2 -o /tmp/held_spawn bench/overhead/held_spawn.c   (with spawn_probe.h beside it)
 *   /tmp/held_spawn [STAGES] [REPS]
 *
 * Prints one JSON object: microseconds per stage of each form (median, min, max over REPS).
 * Wall time: run it on an otherwise quiet machine.
 */
#include "spawn_probe.h"
#include <fcntl.h>
#include <sys/prctl.h>

static char *argv_[] = {"/usr/bin/true", NULL};
static char *envp_[] = {"PATH=/usr/bin:/bin", NULL};
static char stacks[2][65536];

/* A child cloned ahead: its stack, and the pipe it waits on. */
struct held {
    int gate[2];
    pid_t pid;
};

static int vfork_child(void *arg) {
    (void)arg;
    setsid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execve(argv_[0], argv_, envp_);
    _exit(127);
}

/* Shares the parent's memory while the parent runs on: raw system calls only (no errno). */
static int held_child(void *arg) {
    struct held *h = arg;
    char byte;
    syscall(SYS_setsid);
    syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (syscall(SYS_read, h->gate[0], &byte, 1) != 1)
        syscall(SYS_exit, 126);
    syscall(SYS_execve, argv_[0], argv_, envp_);
    syscall(SYS_exit, 127);
    return 0;
}

static void clone_held(struct held *h, char *stack) {
    if (pipe2(h->gate, O_CLOEXEC) != 0) {
        perror("pipe2");
        exit(1);
    }
    h->pid = clone(held_child, stack + sizeof stacks[0], CLONE_VM | SIGCHLD, h);
}

static double chain(int held, int n) {
    double t0 = now();
    if (!held) {
        for (int i = 0; i < n; i++) {
            int status;
            pid_t pid = clone(vfork_child, stacks[0] + sizeof stacks[0],
                              CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
            waitpid(pid, &status, 0);
        }
    } else {
        struct held h[2];
        clone_held(&h[0], stacks[0]);
        for (int i = 0; i < n; i++) {
            struct held *cur = &h[i & 1], *next = &h[(i + 1) & 1];
            if (write(cur->gate[1], "x", 1) != 1)
                exit(1);
            close(cur->gate[1]);
            if (i + 1 < n)
                clone_held(next, stacks[(i + 1) & 1]);
            int status;
            waitpid(cur->pid, &status, 0);
            close(cur->gate[0]);
        }
    }
    return (now() - t0) * 1e6 / n;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3000;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    double *us[2] = {calloc((size_t)reps, sizeof(double)), calloc((size_t)reps, sizeof(double))};
    for (int r = 0; r < reps; r++)
        for (int f = 0; f < 2; f++) {
            int form = r % 2 ? 1 - f : f; /* ABBA */
            us[form][r] = chain(form, n);
        }
    const char *names[2] = {"vfork", "held"};
    printf("{\"stages\": %d, \"reps\": %d, \"us_per_stage\": {", n, reps);
    for (int f = 0; f < 2; f++)
        print_summary(names[f], us[f], reps, f == 0);
    printf("}}\n");
    return 0;
}
