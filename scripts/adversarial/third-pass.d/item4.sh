# shellcheck shell=bash
# 4. Forked stages share random generators created at import: numpy's global `np.random` drew
#    the same value in four instances of a sweep forked from one zygote.
#    Handled: each forked stage reseeds Python's `random`, numpy's global state and torch's CPU
#    generator before its first line: four forked instances, four different values.
#    Needs a Python with numpy: REPRO_PYTHON, ORCHESTRATE_TEST_PYTHON, the repository's
#    .venv-frameworks/, or python3, the first that imports numpy.

numpy_python() {
	local p
	for p in "${REPRO_PYTHON:-}" "${ORCHESTRATE_TEST_PYTHON:-}" "$repo/.venv-frameworks/bin/python" \
		"$(command -v python3)"; do
		[ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import numpy' 2>/dev/null && { echo "$p"; return 0; }
	done
	return 1
}

item4() {
	local python
	python=$(numpy_python) || not_handled "no Python with numpy to reproduce with (set REPRO_PYTHON)" || return
	mkdir mods
	echo 'import numpy.random' >mods/sweep_deps.py
	echo 'import time; time.sleep(2)' >warm.py
	echo 'import numpy as np; print(np.random.rand())' >draw.py
	cat >plan.toml <<EOF
[run]
preload = ["sweep_deps"]

[[stage]]
name = "warm"
command = ["$python", "warm.py"]
env = { PYTHONPATH = "$PWD/mods" }

[[stage]]
name = "draw"
after = ["warm"]
matrix = { i = [1, 2, 3, 4] }
command = ["$python", "draw.py"]
env = { PYTHONPATH = "$PWD/mods" }
EOF
	"$ORCHESTRATE" --plan plan.toml --run-dir run >out.log 2>&1
	local i forked=0 values=()
	for i in 1 2 3 4; do
		values+=("$(cat "run/stages/draw[i=$i]/stdout.log" 2>/dev/null)")
		grep -q "'via': 'zygote'" <<<"$(report_field run "draw[i=$i]" start)" && forked=$((forked + 1))
	done
	local distinct
	distinct=$(printf '%s\n' "${values[@]}" | sort -u | grep -c .)
	[ "$forked" = 4 ] ||
		not_handled "$forked of 4 instances forked from the zygote (start: $(report_field run 'draw[i=1]' start))" || return
	[ "$distinct" = 4 ] ||
		not_handled "four forked instances drew $distinct different np.random.rand() values: ${values[*]}" || return
	handled "four forked instances drew four different np.random.rand() values: ${values[*]}"
}
