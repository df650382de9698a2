# 9. A train stage stopped in its last ten steps and resumed reports an uninterrupted one's
#    final_loss (within 1e-4) and first_loss.
item9() {
	cat >plan.toml <<'EOF2'
[[stage]]
name = "train"
kind = "train"
[stage.params]
steps = 24
batch_size = 16
seq_len = 64
lr = 0.01
warmup_steps = 2
seed = 3
progress_every_s = 0.001
model = { d_model = 128, n_layers = 2, n_heads = 4, max_seq_len = 64 }
EOF2
	"$ORCHESTRATE" --plan plan.toml --run-dir straight >straight.log 2>&1 ||
		not_handled "the uninterrupted run failed" || return
	"$ORCHESTRATE" --plan plan.toml --run-dir stopped >stopped.log 2>&1 &
	local pid=$! step=0
	for _ in $(seq 600); do
		step=$(grep -o '"step":[0-9]*' stopped/stages/train/events.jsonl 2>/dev/null | tail -1 | cut -d: -f2)
		[ "${step:-0}" -ge 16 ] && break
		sleep 0.05
	done
	kill -TERM $pid
	wait $pid
	"$ORCHESTRATE" resume stopped >resume.log 2>&1 || not_handled "the resume failed" || return
	local from=$(report_field stopped train metrics | python3 -c 'import ast,sys; print(ast.literal_eval(sys.stdin.read()).get("resumed_from_step"))')
	local want=$(report_field straight train metrics | python3 -c 'import ast,sys; m = ast.literal_eval(sys.stdin.read()); print(m["final_loss"], m["first_loss"])')
	local got=$(report_field stopped train metrics | python3 -c 'import ast,sys; m = ast.literal_eval(sys.stdin.read()); print(m["final_loss"], m["first_loss"])')
	python3 -c 'import sys; a = sys.argv[1].split(); b = sys.argv[2].split(); sys.exit(not all(abs(float(x) - float(y)) <= 1e-4 for x, y in zip(a, b)))' "$want" "$got" ||
		not_handled "resumed from step $from: final_loss, first_loss $got; uninterrupted $want" || return
	handled "resumed from step $from of 24: final_loss, first_loss $got; uninterrupted $want"
}
