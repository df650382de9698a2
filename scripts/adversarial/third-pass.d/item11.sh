# Item 11: `Authorization: bearer TOKEN`, the scheme in lower case, is accepted (the scheme's
# name is case-insensitive).
item11() {
	local port
	port=$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	DAEMON_SOCK=$PWD/s/d.sock
	"$ORCHESTRATE" daemon --socket "$DAEMON_SOCK" --runs-dir "$PWD/runs" --http "127.0.0.1:$port" </dev/null >daemon.log 2>&1 &
	DAEMON_PID=$!
	for _ in $(seq 200); do [ -s "$DAEMON_SOCK.web-token" ] && break; sleep 0.05; done
	local out
	out=$(timeout 20 python3 - "127.0.0.1:$port" "$(cat "$DAEMON_SOCK.web-token")" <<'EOF'
import socket, sys
a, token = sys.argv[1:]
answers = []
for scheme in ("Bearer", "bearer", "BEARER"):
    h, p = a.rsplit(":", 1)
    s = socket.create_connection((h, int(p)), timeout=5)
    s.sendall(("GET /api/runs HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nAuthorization: %s %s\r\n\r\n" % (a, scheme, token)).encode())
    answers.append("%s=%s" % (scheme, s.recv(100).split(b" ")[1].decode()))
print(" ".join(answers))
EOF
)
	case $out in
	"Bearer=200 bearer=200 BEARER=200") handled "the scheme is read in any case ($out)" ;;
	*) not_handled "${out:-no answer}" ;;
	esac
}
