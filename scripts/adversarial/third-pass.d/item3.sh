# shellcheck shell=bash
# 3. Under the daemon a zygote lives as long as the daemon: after a preloaded module changed on
#    disk, the next run's stage was forked from the old import and ran the old code.
#    Handled: the zygote checks its files before every fork; the next run's stages see the new
#    code (the first exec'd with the reason, the later ones forked from a fresh zygote).

# Submits plan.toml (in this directory) to the daemon and waits for its end; prints the run's
# directory.
submit_and_wait() {
	local answer id
	answer=$(daemon_call "{\"v\":1,\"type\":\"submit\",\"plan\":{\"path\":\"$PWD/plan.toml\"}}")
	id=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' <<<"$answer")
	[ -n "$id" ] || return 1
	daemon_call "{\"v\":1,\"type\":\"wait\",\"id\":\"$id\"}" >/dev/null
	echo "$PWD/runs/$id"
}

item3() {
	mkdir mods
	echo 'VERSION = 1' >mods/versioned.py
	echo 'import time; time.sleep(2)' >warm.py
	echo 'import versioned; print(versioned.VERSION)' >show.py
	cat >plan.toml <<EOF
[run]
preload = ["versioned"]

[[stage]]
name = "warm"
command = ["python3", "warm.py"]
env = { PYTHONPATH = "$PWD/mods" }

[[stage]]
name = "show"
after = ["warm"]
command = ["python3", "show.py"]
env = { PYTHONPATH = "$PWD/mods" }
EOF
	start_daemon "$PWD" || not_handled "the daemon did not start" || return
	local first second
	first=$(submit_and_wait) || not_handled "the first run was not accepted" || return
	echo 'VERSION = 22  # the fix' >mods/versioned.py
	second=$(submit_and_wait) || not_handled "the second run was not accepted" || return
	stop_daemon
	local old new warm_start show_start
	old=$(cat "$first/stages/show/stdout.log" 2>/dev/null)
	new=$(cat "$second/stages/show/stdout.log" 2>/dev/null)
	warm_start=$(report_field "$second" warm start)
	show_start=$(report_field "$second" show start)
	[ "$old" = 1 ] || not_handled "the first run printed '$old', not 1" || return
	[ "$new" = 22 ] ||
		not_handled "after the module was edited the next run's stage printed '$new' ($show_start)" || return
	grep -q 'changed since the zygote imported it' <<<"$warm_start" ||
		not_handled "the new code ran, but the report does not say the zygote was retired: $warm_start" || return
	handled "the next run's stages ran the new code: warm $warm_start; show $show_start"
}
