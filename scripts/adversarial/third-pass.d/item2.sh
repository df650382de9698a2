# shellcheck shell=bash
# 2. A preloaded module that starts a thread holding a lock: a stage forked from that zygote
#    inherits the lock held, with no thread to release it, and hangs until its timeout.
#    Handled: the zygote refuses to serve (one thread only), the stage is exec'd, takes the lock
#    in a moment, and the report names the import that started the thread.

# Seconds between a stage's spawn and its exit, from report.json: stage_seconds RUN_DIR STAGE.
stage_seconds() {
	python3 -c 'import json,sys
r = json.load(open(sys.argv[1] + "/report.json"))
t = [x for x in r["stages"] if x["name"] == sys.argv[2]][0]["timing"]
print("%.2f" % (t["exited"] - t["spawned"]))' "$@" 2>/dev/null
}

item2() {
	mkdir mods
	cat >mods/locker.py <<'EOF'
import threading, time
LOCK = threading.Lock()
def _hold():
    while True:
        with LOCK:
            time.sleep(0.2)
        time.sleep(0.001)
threading.Thread(target=_hold, name="locker-holds", daemon=True).start()
EOF
	echo 'import time; time.sleep(2)' >warm.py
	printf 'import locker\nwith locker.LOCK:\n    print("took the lock")\n' >lock.py
	cat >plan.toml <<EOF
[run]
preload = ["locker"]

[[stage]]
name = "warm"
command = ["python3", "warm.py"]
env = { PYTHONPATH = "$PWD/mods" }

[[stage]]
name = "takes_lock"
after = ["warm"]
command = ["python3", "lock.py"]
timeout = "10s"
env = { PYTHONPATH = "$PWD/mods" }
EOF
	"$ORCHESTRATE" --plan plan.toml --run-dir run >out.log 2>&1
	local status start seconds
	status=$(report_field run takes_lock status)
	start=$(report_field run takes_lock start)
	seconds=$(stage_seconds run takes_lock)
	[ "$status" = succeeded ] ||
		not_handled "the stage that takes the lock: $status after $seconds s ($start)" || return
	grep -q 'locker' <<<"$start" ||
		not_handled "it succeeded, but the report does not say why it was not forked: $start" || return
	handled "the stage was exec'd and took the lock in $seconds s; start: $start"
}
