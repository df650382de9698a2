# Item 5: idle TCP connections without the token (from uid 65534 when run as root) to the web
# view and to --metrics-addr lock out neither the owner, nor a scrape, nor the socket's clients;
# the daemon, started with a soft open files limit of 1,024, raises it.
item5() {
	local ports
	ports=$(python3 -c 'import socket
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' | tr '\n' ' ')
	set -- $ports
	local web=127.0.0.1:$1 metrics=127.0.0.1:$2
	DAEMON_SOCK=$PWD/s/d.sock
	(ulimit -Sn 1024 && exec "$ORCHESTRATE" daemon --socket "$DAEMON_SOCK" --runs-dir "$PWD/runs" \
		--http "$web" --metrics-addr "$metrics" </dev/null >daemon.log 2>&1) &
	DAEMON_PID=$!
	for _ in $(seq 200); do [ -s "$DAEMON_SOCK.web-token" ] && [ -S "$DAEMON_SOCK" ] && break; sleep 0.05; done
	local soft hard
	read -r soft hard < <(awk '/^Max open files/ {print $4, $5}' /proc/$DAEMON_PID/limits)
	[ "$soft" = "$hard" ] || not_handled "the daemon kept a soft open files limit of $soft (hard $hard)" || return
	local out
	out=$(timeout 50 python3 - "$web" "$metrics" "$(cat "$DAEMON_SOCK.web-token")" "$DAEMON_SOCK" <<'EOF'
import os, select, socket, sys, time
web, metrics, token, sock = sys.argv[1:]
def addr(a):
    h, p = a.rsplit(":", 1); return (h, int(p))
r, w = os.pipe()
child = os.fork()
if child == 0:
    import resource
    os.close(r)
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, max(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
    if os.geteuid() == 0:
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
    conns = {}
    def open_one(target):
        s = socket.socket()
        try:
            s.connect(target); conns[s.fileno()] = (s, target)
        except OSError:
            s.close()
    for t in (addr(web), addr(metrics)):
        for _ in range(1100):
            open_one(t)
    os.write(w, b"%d %d\n" % (len(conns), os.getuid())); os.close(w)
    poll = select.poll()
    while True:  # keep them up: open again whatever the daemon closes
        poll = select.poll()
        for fd in conns: poll.register(fd, select.POLLIN | select.POLLRDHUP)
        for fd, _ in poll.poll(200):
            s, t = conns.pop(fd); s.close(); open_one(t)
os.close(w)
held, uid = os.read(r, 100).split()
def get(a, path, headers):
    try:
        s = socket.create_connection(addr(a), timeout=5)
        s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s\r\n" % (path, a, headers)).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk: break
            data += chunk
        return data.split(b" ", 2)[1].decode() if data else "closed"
    except OSError as e:
        return type(e).__name__
def call(line):
    try:
        s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sock)
        f = s.makefile("rwb"); f.readline(); f.write(line.encode() + b"\n"); f.flush()
        return "ok" if b'"runs"' in f.readline() else "bad answer"
    except OSError as e:
        return type(e).__name__
bad = []
end = time.time() + 7
rounds = 0
while time.time() < end:
    t0 = time.time()
    got = (get(web, "/api/runs", "Authorization: Bearer %s\r\n" % token), get(metrics, "/metrics", ""),
           call('{"v": 1, "type": "list"}'))
    if got != ("200", "200", "ok") or time.time() - t0 > 5:
        bad.append("%s in %.1f s" % (",".join(got), time.time() - t0))
    rounds += 1
    time.sleep(0.25)
os.kill(child, 9); os.waitpid(child, 0)
print("held=%s uid=%s rounds=%d bad=%d first_bad=%s" % (held.decode(), uid.decode(), rounds, len(bad), bad[:1]))
EOF
)
	case $out in
	*" bad=0 "*) handled "owner, scrape and socket answered every time under 2,200 idle connections ($out; soft nofile $soft)" ;;
	*) not_handled "under the idle connections: ${out:-no answer}" ;;
	esac
}
