# Shared by the adversarial passes (scripts/adversarial/second-pass, third-pass): the
# helpers their items use and the driver that runs each item in a scratch directory of its own,
# in a process of its own under `timeout`. A script sets NAME (for its scratch directory), defines
# its `itemN` functions, then calls `repro_main "$0" "$@"`.
#
# ORCHESTRATE names the binary (default: target/debug/orchestrate, built by
# `cargo build --bins`); ITEM_TIMEOUT bounds each item, in seconds (default 60).

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ORCHESTRATE=${ORCHESTRATE:-$repo/target/debug/orchestrate}
ITEM_TIMEOUT=${ITEM_TIMEOUT:-60}

handled() { echo "handled: $*"; }
not_handled() { echo "NOT HANDLED: $*"; return 1; }

# --- helpers shared by the items -------------------------------------------------------------

# Starts a daemon on $1/d.sock with runs in $1/runs; sets DAEMON_PID and DAEMON_SOCK.
start_daemon() {
	DAEMON_SOCK=$1/d.sock
	"$ORCHESTRATE" daemon --socket "$DAEMON_SOCK" --runs-dir "$1/runs" </dev/null >"$1/daemon.log" 2>&1 &
	DAEMON_PID=$!
	for _ in $(seq 200); do
		[ -S "$DAEMON_SOCK" ] && return 0
		sleep 0.05
	done
	return 1
}

stop_daemon() {
	[ -n "${DAEMON_PID:-}" ] || return 0
	kill -TERM "$DAEMON_PID" 2>/dev/null
	for _ in $(seq 100); do
		kill -0 "$DAEMON_PID" 2>/dev/null || return 0
		sleep 0.05
	done
	kill -KILL "$DAEMON_PID" 2>/dev/null
}

# Sends the JSON request $1 to the daemon and prints its answer (one line), within 10 s.
daemon_call() {
	timeout 12 python3 - "$DAEMON_SOCK" "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
f = s.makefile("rwb")
f.readline()  # hello
f.write(sys.argv[2].encode() + b"\n")
f.flush()
print(f.readline().decode().strip() or "(no answer)")
EOF
}

# A field of report.json's stage record: report_field RUN_DIR STAGE FIELD.
report_field() {
	python3 -c 'import json,sys
r = json.load(open(sys.argv[1] + "/report.json"))
s = [x for x in r["stages"] if x["name"] == sys.argv[2]][0]
print(s.get(sys.argv[3]))' "$@" 2>/dev/null
}

# --- driver ----------------------------------------------------------------------------------

# repro_main SCRIPT [ITEM...]: runs the items named (every itemN defined, N from 1 to 30 and
# Nb, when none is) and prints one line each; exit status 0 when every item run is handled.
repro_main() {
	local script=$1
	shift

	if [ "${1:-}" = --one ]; then
		# One item, in its own scratch directory (the caller bounds it with `timeout`).
		cd "$2" || exit 1
		trap stop_daemon EXIT
		trap 'exit 143' TERM
		"item$3"
		exit
	fi

	[ -x "$ORCHESTRATE" ] || {
		echo "no binary at $ORCHESTRATE: run \`cargo build --bins\` (or set ORCHESTRATE)" >&2
		exit 2
	}
	if [ $# -gt 0 ]; then
		items=("$@")
	else
		items=()
		for n in $(seq 1 30); do
			for item in "$n" "${n}b"; do declare -F "item$item" >/dev/null && items+=("$item"); done
		done
	fi
	scratch=$(mktemp -d "${TMPDIR:-/tmp}/${NAME:-repro}.XXXXXX")
	failed=0
	for n in "${items[@]}"; do
		if ! declare -F "item$n" >/dev/null; then
			printf 'item %-3s no reproduction in this script\n' "$n"
			continue
		fi
		mkdir -p "$scratch/item$n"
		timeout -k 5 "$ITEM_TIMEOUT" bash "$script" --one "$scratch/item$n" "$n" >"$scratch/item$n.out" 2>&1
		rc=$?
		line=$(tail -1 "$scratch/item$n.out")
		if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
			line="NOT HANDLED: no answer within ${ITEM_TIMEOUT} s"
		fi
		case $line in handled:*) ;; *) failed=1 ;; esac
		printf 'item %-3s %s\n' "$n" "$line"
	done
	rm -rf "$scratch"
	exit $failed
}
