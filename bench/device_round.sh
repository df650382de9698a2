#!/usr/bin/env bash
# The GPU measurements the open issues wait for, in parts that each fit one device call
# (under 10 minutes). Run from the repository root on the lent GPU host, with the release
# binaries (and COMMIT) in .carry/ and DeepSpeed's wheels in .whl/ (carry both):
#   bash bench/device_round.sh PART        results under $OUT/PART
# PART:
#   llama     issue 50: the 1B Llama step against torch.compile, 3 rounds of 100 steps (7-9 min)
#   sharing   issues 47, 48: where a tiny GPU stage's exit goes (gpu_exit_probe.py), then 40
#             tiny stages one per GPU against four per GPU (time-sliced, and through MPS), cold
#             (CLI) and warm (daemon), and the shared leak, time-sliced and through MPS (3-6 min)
#   zygote    issue 48: first line of a torch + transformers + DeepSpeed stage, and seed 001's
#             DeepSpeed sweep, through the zygote and exec'd (5-8 min)
#   overhead  issue 44: no-op stages against a885c33's binary (.carry/orchestrate-a885c33)
#             on tmpfs and disk, 1,000 and 20,000 stages (4-6 min)
#   start     issue 44: a one-stage run's start and end, this build against a885c33, with debug
#             logs and strace (bench/overhead/start_trace.sh; 1 min)
#   kernels   issue 44: `stage-worker check-kernels` (the fused kernels and the AdamW step
#             against libtorch's), compiled and from the cache, then the 100M model's
#             throughput with this worker, 98d3509's (.carry/stage-worker-98d3509: before the
#             AdamW step took its parameters as a `FlatParams` view) and torch.compile,
#             3 rounds (5-7 min)
#   standby   issue 48: whether DeepSpeed is preloaded under the zygote's NVML hold and a GPU
#             stage begins as a zygote's standby (standby_check.sh: 3 chained stages importing
#             DeepSpeed, the zygote's and standbys' logs), then nvml_hold_probe.py (torch and
#             DeepSpeed imported with the hold and without; 2-3 min); run it first: what it
#             says decides the first line's next step
#   boundary  issue 44: the 100M chain's stage boundary with this build against .carry/before/ (the
#             build before the stage-worker's move), alternated twice (3-5 min)
#   context   issue 47: CUDA contexts made 1, 2, 4 and 8 at once on the GPU, plainly and under a
#             private MPS daemon, and what NVML lists for an MPS client (context_probe.sh; 1-2 min)
#   context-env  issue 47: context_probe.py at widths 1 and 4 under several CUDA settings
#             (bench/sharing/context_env.sh; 2-3 min)
#   queue-cost  issue 47: what CUDA_DEVICE_MAX_CONNECTIONS=1 costs a small training loop and
#             two overlapping streams (bench/sharing/queue_cost.py; 1 min)
#   reap      issue 47: whether the driver still lists a process after its reaping, four at
#             once (bench/sharing/listed_after_reap.py; 1 min), the premise of the shared
#             verdict's waiting for a reaped main process; and whether NVML's thread ever
#             leaves after nvmlShutdown (bench/zygote/nvml_thread_lifetime.py; issue 48)
# Environment: REPS (sharing's repetitions, 2), EXIT_PROBE=0 (sharing without gpu_exit_probe.py),
# WARM=0 (sharing without the daemon's runs), ROUNDS (boundary's alternations, 2); zygote's
# FIRST_LINE_ONLY, SEED_ONLY, LEARN_ONLY and SWEEPS (bench/zygote/run.sh).
# bench/device_session.sh runs several parts in one call and packs what each wrote.
# The calls that produced this round's figures (2026-12-05, third session; carry .carry):
#   bench/device_session.sh context-env overhead:SIZES=1000:4
#   bench/device_session.sh "sharing:REPS=3,EXIT_PROBE=0,WARM=1,COLD=1,MODES=whole whole1 shared mps"
#   bench/device_session.sh "start:RUNS=6,SIZES=1 100 1000"
# A whole round of every part takes 25-35 minutes, about a session's device time once each
# call's start is counted; run them in this order (the issues' closing weight), `overhead`
# last (the 2-core machine also measures it):
#   llama, zygote, sharing, kernels, overhead
set -uo pipefail
part=${1:?name a part: llama, sharing, zygote, overhead, kernels, standby, boundary, context, context-env, queue-cost, start or reap}
: "${OUT:?}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
res="$OUT/$part"
mkdir -p "$res"
{ date -u; cat .carry/COMMIT; nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used --format=csv; } \
  > "$res/machine.txt" 2>&1
case $part in
  llama)
    ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-100} BIN_DIR=.carry OUT="$res" timeout 570 bash bench/llama/gpu.sh \
      > "$res/log.txt" 2>&1
    echo "exit $?"; tail -n 25 "$res/log.txt" ;;
  sharing)
    if [ "${EXIT_PROBE:-1}" = 1 ]; then
      timeout 120 python3 bench/zygote/gpu_exit_probe.py 5 > "$res/gpu-exit-probe.txt" 2>&1
      cat "$res/gpu-exit-probe.txt"
    fi
    BIN_DIR=.carry OUT="$res" REPS=${REPS:-2} timeout 420 bash bench/sharing/gpu.sh > "$res/log.txt" 2>&1
    echo "exit $?"; cat "$res/sharing/summary.txt" "$res/sharing/phases.txt" 2> /dev/null ;;
  zygote)
    OUT="$res" timeout 560 bash bench/zygote/run.sh .carry > "$res/log.txt" 2>&1
    echo "exit $?"; tail -n 30 "$res/log.txt" ;;
  overhead)
    mkdir -p "$res/bins"; cp .carry/orchestrate "$res/bins/orchestrate-new"; cp .carry/orchestrate-a885c33 "$res/bins/"
    BIN_DIR="$res/bins" OLD=a885c33 NEW=$(cat .carry/COMMIT) OUT="$res" timeout 560 bash bench/overhead/device.sh \
      > "$res/log.txt" 2>&1
    echo "exit $?"; tail -n 30 "$res/log.txt"; rm -rf "$res/bins" ;;
  start)
    # issue 44 item 7: where a run's start goes on a GPU host, this build against a885c33 (1 min)
    mkdir -p "$res/bins"; cp .carry/orchestrate "$res/bins/orchestrate-new"; cp .carry/orchestrate-a885c33 "$res/bins/"
    BIN_DIR="$res/bins" OLD=a885c33 OUT="$res" timeout 200 bash bench/overhead/start_trace.sh > "$res/log.txt" 2>&1
    echo "exit $?"; cat "$res/log.txt"; rm -rf "$res/bins" ;;
  kernels)
    timeout 150 bash bench/throughput/check_kernels.sh .carry "$res" > "$res/log.txt" 2>&1
    echo "exit $?"; tail -n 12 "$res/log.txt"
    SHAPES=m100 REPEATS=3 PEERS=compile WORKER_VARIANTS="default WORKER=$PWD/.carry/stage-worker-98d3509" \
      timeout 400 bash bench/throughput/run.sh .carry "$res/throughput" > "$res/throughput.log" 2>&1
    echo "exit $?"; cat "$res/throughput/summary.md" 2> /dev/null || tail -n 20 "$res/throughput.log" ;;
  standby)
    OUT="$OUT" LIMIT=90 timeout 150 bash bench/zygote/standby_check.sh .carry > "$res/log.txt" 2>&1
    echo "exit $?"; cat "$res/log.txt"
    # torch and DeepSpeed (installed in /tmp/site by standby_check.sh) under the NVML hold and
    # without it, against the driver's NVML.
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/site timeout 120 python3 bench/zygote/nvml_hold_probe.py \
      > "$res/nvml-hold-probe.json" 2> "$res/nvml-hold-probe.err"
    echo "exit $?"; cat "$res/nvml-hold-probe.json" ;;
  boundary)
    # issue 44: the built-in chain's boundary (100M model, 5 stages) with this build and with
    # .carry/before/ (the build before the stage-worker's move, its COMMIT beside it),
    # alternated twice; the one-process Python peer once (3-5 min)
    for round in $(seq "${ROUNDS:-2}"); do
      for v in new before; do
        bin=.carry; [ $v = before ] && bin=.carry/before
        variants="orchestrate orchestrate-reps"; [ "$round$v" = 1new ] && variants="$variants python-one"
        PARTS=m100 ORCH_REPS=2 CHAIN_VARIANTS=$variants timeout 200 bash bench/boundary/run.sh "$bin" "$res/$v-$round" \
          > "$res/$v-$round.log" 2>&1
        echo "$v round $round: exit $?"; grep -A4 "chain stages" "$res/$v-$round/summary.md" 2> /dev/null
      done
    done ;;
  context)
    # issue 47: CUDA contexts made at once on one GPU, plainly and under MPS (1 min)
    timeout 330 bash bench/sharing/context_probe.sh "$res" > "$res/log.txt" 2>&1
    echo "exit $?"; cat "$res/log.txt" "$res/mps.txt"
    python3 -c 'import json, sys
for f in sys.argv[1:]:
    try: d = json.load(open(f))
    except Exception as e: print(f, e); continue
    for w, v in d["widths"].items(): print(f, w, "at once: context", round(v["context_ms"]["median"]), "ms, init", round(v["init_ms"]["median"]), "ms,", round(v["stages_per_s"]["median"], 1), "/s")' "$res"/context-*.json ;;
  context-env)
    # issue 47: whether a CUDA setting makes contexts cheaper or queue less (2-3 min)
    timeout 400 bash bench/sharing/context_env.sh "$res" "${WAVES:-4}" > "$res/log.txt" 2>&1
    echo "exit $?"; cat "$res/log.txt" ;;
  queue-cost)
    # issue 47: what one work queue costs a stage's own work (bench/sharing/queue_cost.py; 1 min)
    timeout 200 python3 bench/sharing/queue_cost.py "${ROUNDS:-5}" > "$res/queue-cost.json" 2> "$res/queue-cost.err"
    echo "exit $?"; cat "$res/queue-cost.json"; tail -n 5 "$res/queue-cost.err" ;;
  reap)
    timeout 120 python3 bench/sharing/listed_after_reap.py 15 > "$res/listed-after-reap.txt" 2>&1
    echo "exit $?"; cat "$res/listed-after-reap.txt"
    timeout 60 python3 bench/zygote/nvml_thread_lifetime.py > "$res/nvml-thread-lifetime.txt" 2>&1
    echo "exit $?"; cat "$res/nvml-thread-lifetime.txt" ;;
  *) echo "no part $part"; exit 2 ;;
esac
