# 8. A stage that repeats `step == total` progress gets a bounded number of console lines and
#    run events.
item8() {
	cat >flood.py <<'PY'
import json, os, socket
c = socket.socket(socket.AF_UNIX)
c.connect(os.environ["ORCHESTRATE_EVENTS"])
line = (json.dumps({"v": 1, "event": "progress", "step": 5, "total_steps": 5}) + "\n").encode()
c.sendall(line * 20000)
PY
	printf '[[stage]]\nname = "flood"\ncommand = ["python3", "%s/flood.py"]\n' "$PWD" >plan.toml
	timeout -k 3 60 "$ORCHESTRATE" --plan plan.toml --run-dir run >log 2>&1
	local rc=$? lines
	lines=$(grep -c "flood: step 5/5" log)
	[ $rc = 0 ] && [ "$lines" -le 10 ] ||
		not_handled "20,000 progress events with step == total: exit $rc, $lines console lines" || return
	start_daemon "$PWD" || not_handled "the daemon did not start" || return
	local toml out id events
	toml=$(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' plan.toml)
	out=$(daemon_call "{\"v\":1,\"type\":\"submit\",\"plan\":{\"toml\":$toml},\"base_dir\":\"$PWD\"}")
	id=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' <<<"$out")
	daemon_call "{\"v\":1,\"type\":\"wait\",\"id\":\"$id\"}" >/dev/null
	events=$(grep -c '"progress"' "runs/$id/events.jsonl" 2>/dev/null)
	[ -n "$id" ] && [ "${events:-0}" -le 10 ] ||
		not_handled "20,000 progress events with step == total: ${events:-?} run events in the daemon" || return
	handled "20,000 progress events with step == total: $lines console line(s), $events run event(s)"
}
