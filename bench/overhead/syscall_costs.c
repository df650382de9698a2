/* What single system calls on the path between two stages cost on this machine, warm caches:
 * each loop runs N times and prints its mean in microseconds (see syscalls.py). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  const int n = 20000, files = 2000;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  pid_t self = getpid();
  char path[512];
  double t;

  t = now_us();
  for (int i = 0; i < n; i++) {
    int fd = syscall(SYS_pidfd_open, self, 0);
    close(fd);
  }
  printf("\"pidfd_open_close_us\": %.2f,\n", (now_us() - t) / n);

  t = now_us();
  for (int i = 0; i < n; i++) {
    int fd = syscall(SYS_pidfd_open, self, 0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
  }
  printf("\"pidfd_open_epoll_add_del_close_us\": %.2f,\n", (now_us() - t) / n);

  struct epoll_event evs[8];
  t = now_us();
  for (int i = 0; i < n; i++) epoll_wait(ep, evs, 8, 0);
  printf("\"epoll_wait_zero_timeout_us\": %.2f,\n", (now_us() - t) / n);

  t = now_us();
  for (int i = 0; i < n; i++) waitpid(-1, NULL, WNOHANG);
  printf("\"wait4_no_child_us\": %.2f,\n", (now_us() - t) / n);

  snprintf(path, sizeof path, "%s/journal.jsonl", dir);
  int j = open(path, O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0644);
  char line[410];
  memset(line, 'x', sizeof line - 1);
  line[sizeof line - 1] = '\n';
  t = now_us();
  for (int i = 0; i < n; i++) (void)!write(j, line, sizeof line);
  printf("\"append_410_bytes_us\": %.2f,\n", (now_us() - t) / n);
  close(j);
  unlink(path);

  static int fds[2000];
  for (int i = 0; i < files; i++) {
    snprintf(path, sizeof path, "%s/log%d", dir, i);
    fds[i] = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  }
  t = now_us();
  for (int i = 0; i < files; i++) close(fds[i]);
  printf("\"close_new_log_file_us\": %.2f\n", (now_us() - t) / files);
  for (int i = 0; i < files; i++) {
    snprintf(path, sizeof path, "%s/log%d", dir, i);
    unlink(path);
  }
  return 0;
}
