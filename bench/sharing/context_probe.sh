#!/usr/bin/env bash
# context_probe.py on the GPU host: plainly, then (where the driver ships the MPS control
# daemon) under a private MPS daemon, with what NVML lists while an MPS client holds memory.
#   bench/sharing/context_probe.sh OUT_DIR [WAVES]
# Writes OUT_DIR/context-plain.json, context-mps.json, mps-nvml.txt and mps.txt.
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
waves=${2:-4}
here=$(cd "$(dirname "$0")" && pwd)
timeout 150 python3 "$here/context_probe.py" "$waves" > "$out/context-plain.json" 2> "$out/context-plain.err"
echo "plain: exit $?"
if ! command -v nvidia-cuda-mps-control > /dev/null; then
  echo "no nvidia-cuda-mps-control on this host" | tee "$out/mps.txt"
  exit 0
fi
mps=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d > "$out/mps.txt" 2>&1
echo "mps control: exit $?" >> "$out/mps.txt"
timeout 150 python3 "$here/context_probe.py" "$waves" > "$out/context-mps.json" 2> "$out/context-mps.err"
echo "mps: exit $?"
# What NVML lists while one MPS client holds 1 GiB: the server, the client, and their memory.
python3 - > "$out/mps-nvml.txt" 2>&1 <<'EOF'
import os, subprocess, time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("client pid", os.getpid())
print(subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                      "--format=csv"], capture_output=True, text=True).stdout)
try:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        print("nvml compute", p.pid, p.usedGpuMemory)
    for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h):
        print("nvml mps", p.pid, p.usedGpuMemory)
    print("device used", pynvml.nvmlDeviceGetMemoryInfo(h).used)
except Exception as e:
    print("pynvml:", e)
EOF
cat "$CUDA_MPS_LOG_DIRECTORY"/*.log >> "$out/mps.txt" 2>/dev/null
echo quit | nvidia-cuda-mps-control >> "$out/mps.txt" 2>&1
sleep 1
rm -rf "$mps"
