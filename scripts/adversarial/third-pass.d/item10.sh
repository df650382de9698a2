# 10. Validation is linear in one stage's `after` list and in unknown `params` keys.
item10() {
	python3 - <<'PY'
n = 40000
with open("after.toml", "w") as f:
    f.write('[[stage]]\nname = "a"\ncommand = ["true"]\n\n[[stage]]\nname = "b"\ncommand = ["true"]\nafter = [')
    f.write(", ".join('"x%d"' % i for i in range(n)) + "]\n")
with open("params.toml", "w") as f:
    f.write('[[stage]]\nname = "t"\nkind = "train"\n[stage.params]\n' + "".join("k%d = 1\n" % i for i in range(n)))
PY
	local t0 t1 t2 rc1 rc2
	t0=$(date +%s%N)
	timeout 30 "$ORCHESTRATE" validate after.toml >/dev/null 2>&1
	rc1=$?
	t1=$(date +%s%N)
	timeout 30 "$ORCHESTRATE" validate params.toml >/dev/null 2>&1
	rc2=$?
	t2=$(date +%s%N)
	local a=$(((t1 - t0) / 1000000)) p=$(((t2 - t1) / 1000000))
	[ $rc1 = 2 ] && [ $rc2 = 2 ] && [ $a -lt 5000 ] && [ $p -lt 5000 ] ||
		not_handled "40,000 \`after\` entries: exit $rc1 in $a ms; 40,000 unknown params: exit $rc2 in $p ms" || return
	handled "40,000 \`after\` entries refused in $a ms, 40,000 unknown params in $p ms"
}
