# Item 6: two daemons' web views on one machine: a login to the second leaves the first's
# alone (each cookie has a name of its own), as a browser keeps cookies per host, not per port.
item6() {
	local ports
	ports=$(python3 -c 'import socket
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' | tr '\n' ' ')
	set -- $ports
	local one=127.0.0.1:$1 two=127.0.0.1:$2 other_pid
	DAEMON_SOCK=$PWD/a/d.sock
	"$ORCHESTRATE" daemon --socket "$PWD/a/d.sock" --runs-dir "$PWD/runs-a" --http "$one" </dev/null >a.log 2>&1 &
	DAEMON_PID=$!
	"$ORCHESTRATE" daemon --socket "$PWD/b/d.sock" --runs-dir "$PWD/runs-b" --http "$two" </dev/null >b.log 2>&1 &
	other_pid=$!
	for _ in $(seq 200); do [ -s a/d.sock.web-token ] && [ -s b/d.sock.web-token ] && break; sleep 0.05; done
	local out
	out=$(timeout 20 python3 - "$one" "$(cat a/d.sock.web-token)" "$two" "$(cat b/d.sock.web-token)" <<'EOF'
import socket, sys
def get(a, path, headers=""):
    h, p = a.rsplit(":", 1)
    s = socket.create_connection((h, int(p)), timeout=5)
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s\r\n" % (path, a, headers)).encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk: break
        data += chunk
    head = data.split(b"\r\n\r\n")[0].decode()
    cookie = [l.split(":", 1)[1].strip() for l in head.split("\r\n") if l.lower().startswith("set-cookie:")]
    return head.split(" ")[1], cookie
jar = {}  # one host name, one jar: a browser keeps cookies per host, not per port
for a, t in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])):
    status, set_cookie = get(a, "/?token=" + t)
    name, value = set_cookie[0].split(";")[0].split("=", 1)
    jar[name] = value
header = "Cookie: %s\r\n" % "; ".join("%s=%s" % kv for kv in jar.items())
print("names=%s first=%s second=%s" % (",".join(jar), get(sys.argv[1], "/api/runs", header)[0], get(sys.argv[3], "/api/runs", header)[0]))
EOF
)
	kill -TERM "$other_pid" 2>/dev/null
	case $out in
	*"first=200 second=200"*) handled "both logins kept after logging into the second daemon ($out)" ;;
	*) not_handled "logging into the second daemon: ${out:-no answer}" ;;
	esac
}
