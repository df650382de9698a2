# 7. A replay of a finished run's events costs the daemon a bounded amount per watcher that does
#    not read, answers others at once, and leaves nothing once its watchers go.
item7() {
	start_daemon "$PWD" || not_handled "the daemon did not start" || return
	local toml='[[stage]]\nname = \"a\"\ncommand = [\"true\"]\n'
	local out id
	out=$(daemon_call "{\"v\":1,\"type\":\"submit\",\"plan\":{\"toml\":\"$toml\"},\"base_dir\":\"$PWD\"}")
	id=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' <<<"$out")
	[ -n "$id" ] || not_handled "submit: ${out:0:200}" || return
	daemon_call "{\"v\":1,\"type\":\"wait\",\"id\":\"$id\"}" >/dev/null
	stop_daemon
	# The finished run's log made 200,000 events long.
	python3 - "runs/$id/events.jsonl" <<'PY'
import sys
path = sys.argv[1]
lines = open(path).read().splitlines(True)
with open(path, "a") as f:
    f.write(lines[0] * (200000 - len(lines)))
PY
	start_daemon "$PWD" || not_handled "the daemon did not restart" || return
	local before=$(awk '/^VmRSS/ {print $2}' /proc/$DAEMON_PID/status)
	timeout 60 python3 - "$DAEMON_SOCK" "$id" "$DAEMON_PID" "$before" >measure.txt <<'PY'
import json, socket, sys, time
sock, run, pid, before = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
watchers = []
for _ in range(8):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall((json.dumps({"v": 1, "type": "watch", "id": run, "from": 0}) + "\n").encode())
    watchers.append(s)  # never read
peak, slowest = before, 0.0
for _ in range(20):
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(30)
    c.connect(sock)
    f = c.makefile("rwb")
    t = time.monotonic()
    f.readline()
    f.write((json.dumps({"v": 1, "type": "status", "id": run}) + "\n").encode())
    f.flush()
    f.readline()
    slowest = max(slowest, time.monotonic() - t)
    c.close()
    peak = max(peak, rss())
    time.sleep(0.1)
for s in watchers:
    s.close()
time.sleep(1)
print(before // 1024, peak // 1024, rss() // 1024, f"{slowest:.2f}")
PY
	local b p a slow
	read -r b p a slow <measure.txt
	[ -n "$slow" ] || not_handled "no measurement (the daemon stalled?)" || return
	[ $((p - b)) -lt 64 ] && [ $((a - b)) -lt 64 ] && awk "BEGIN {exit !($slow < 1)}" ||
		not_handled "8 watchers not reading a 200,000-event replay: RSS $b -> $p MB, $a MB after they left; slowest status ${slow} s" || return
	handled "8 watchers not reading a 200,000-event replay: RSS $b -> $p MB, $a MB after they left; slowest status answer ${slow} s"
}
