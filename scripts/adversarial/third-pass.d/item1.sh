# shellcheck shell=bash
# 1. A stage process that writes its own pid into another cgroup's `cgroup.procs` (here the
#    root's, which root may write) is still the stage's: reported among its leftovers and
#    killed with it, not left running. Where the kernel allows, each stage is in a cgroup
#    namespace of its own (`/proc/self/cgroup` reads `0::/` inside it).
item1() {
	local root pid leftovers namespace
	root=$(awk '$0 ~ / - cgroup2 / { print $5; exit }' /proc/self/mountinfo)
	cat >plan.toml <<EOF
[[stage]]
name = "mover"
command = ["sh", "-c", "setsid env -i sleep 301 </dev/null >/dev/null 2>&1 & echo \$! > $PWD/pid; echo \$! > ${root:-/nonexistent}/cgroup.procs && touch $PWD/moved; grep '^0::' /proc/self/cgroup > $PWD/cgroup; sleep 0.3"]
EOF
	timeout -k 3 30 "$ORCHESTRATE" --plan plan.toml --run-dir run >log 2>&1
	pid=$(cat pid 2>/dev/null)
	[ -n "$pid" ] || not_handled "the stage did not start: $(tail -3 log)" || return
	for _ in $(seq 40); do
		[ "$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)" = "sleep 301 " ] || break
		sleep 0.05
	done
	if [ "$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)" = "sleep 301 " ]; then
		kill -KILL "$pid"
		not_handled "pid $pid moved itself to ${root:-?} and outlived the run (leftovers: $(report_field run mover leftover_processes))"
		return
	fi
	leftovers=$(report_field run mover leftover_processes)
	grep -q "pid $pid (sleep)" <<<"$leftovers" ||
		not_handled "pid $pid is gone but not among the stage's leftovers: $leftovers" || return
	namespace=$(grep -o 'cgroup namespaces: .*' <("$ORCHESTRATE" doctor) || echo "no stage cgroups here")
	handled "pid $pid, moved $([ -e moved ] && echo "into $root" || echo "(refused by the kernel)"), reported as a leftover and killed; inside the stage $(cat cgroup 2>/dev/null); ${namespace}"
}
