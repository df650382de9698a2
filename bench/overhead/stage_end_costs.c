/* What the calls a stage's cgroup and its held rendezvous port add to the scheduling
 * thread's path cost on this machine, one by one, warm caches:
 *   - reading a stage cgroup's `cgroup.events` (is it empty?) and `cgroup.stat` (any cgroup
 *     below it?) through files kept open, against a `statx` of the cgroup's directory, held
 *     open, whose link count answers the second question;
 *   - reading the orchestrator's list of children (the subreaper's view of a stage's leftovers);
 *   - closing a bound TCP socket (the port held for a stage until its spawn) and making one
 *     (socket, bind to port 0, getsockname: what the stage-files thread does ahead).
 *
 *   cc -O2 -o /tmp/stage_end_costs bench/overhead/stage_end_costs.c
 *   /tmp/stage_end_costs CGROUP_V2_DIR
 *
 * CGROUP_V2_DIR: a delegated cgroup v2 directory; the probe makes and removes
 * "stage-end-costs-probe" in it. Prints one JSON object: microseconds per call, the mean of
 * 20,000 calls (2,000 sockets). Run it on an otherwise quiet machine.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int open_in(const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return open(path, O_RDONLY | O_CLOEXEC);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CGROUP_V2_DIR\n", argv[0]);
        return 2;
    }
    const int n = 20000, sockets = 2000;
    char dir[4096], buf[1024], children[64];
    snprintf(dir, sizeof dir, "%s/stage-end-costs-probe", argv[1]);
    if (mkdir(dir, 0755) != 0) {
        perror(dir);
        return 1;
    }
    int events = open_in(dir, "cgroup.events"), stat = open_in(dir, "cgroup.stat");
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    snprintf(children, sizeof children, "/proc/self/task/%d/children", getpid());
    int kids = open(children, O_RDONLY | O_CLOEXEC);
    if (events < 0 || stat < 0 || dir_fd < 0 || kids < 0) {
        perror("open");
        rmdir(dir);
        return 1;
    }
    struct statx sx;
    double t;
    printf("{");

    t = now_us();
    for (int i = 0; i < n; i++) (void)!pread(events, buf, sizeof buf, 0);
    printf("\"pread_cgroup_events_us\": %.2f, ", (now_us() - t) / n);

    t = now_us();
    for (int i = 0; i < n; i++) (void)!pread(stat, buf, sizeof buf, 0);
    printf("\"pread_cgroup_stat_us\": %.2f, ", (now_us() - t) / n);

    t = now_us();
    for (int i = 0; i < n; i++) statx(dir_fd, "", AT_EMPTY_PATH, STATX_NLINK, &sx);
    printf("\"statx_cgroup_dir_fd_us\": %.2f, ", (now_us() - t) / n);

    t = now_us();
    for (int i = 0; i < n; i++) (void)!pread(kids, buf, sizeof buf, 0);
    printf("\"pread_own_children_us\": %.2f, ", (now_us() - t) / n);

    static int held[2000];
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    t = now_us();
    for (int i = 0; i < sockets; i++) {
        socklen_t len = sizeof addr;
        addr.sin_port = 0;
        held[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (bind(held[i], (struct sockaddr *)&addr, sizeof addr) != 0 ||
            getsockname(held[i], (struct sockaddr *)&addr, &len) != 0) {
            perror("bind");
            return 1;
        }
    }
    printf("\"tcp_socket_bind_getsockname_us\": %.2f, ", (now_us() - t) / sockets);

    t = now_us();
    for (int i = 0; i < sockets; i++) close(held[i]);
    printf("\"close_bound_tcp_socket_us\": %.2f}\n", (now_us() - t) / sockets);

    close(events);
    close(stat);
    close(dir_fd);
    close(kids);
    rmdir(dir);
    return 0;
}
