# Sourced by the device benchmarks' run.sh: `bench_setup BIN_DIR` puts this host's torch/lib
# on LD_LIBRARY_PATH (the binaries link against the host's libtorch) and unbuffers Python;
# `machine_info BIN_DIR` prints what a result must name: date, the binaries' commit, the GPU
# (name, UUID, driver, memory), the CPU and torch.
bench_setup() {
  local torch_lib
  torch_lib=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONUNBUFFERED=1
}

machine_info() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "binaries built from: $(cat "$1/COMMIT" 2>/dev/null || echo unknown)"
  echo "gpu: $(nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
  echo "torch: $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null)"
}
