"""A GPU stage that says which device its CUDA context is on, by the names orchestrate gave it:
CUDA_VISIBLE_DEVICES (an index), CUDA_DEVICE_ORDER, ORCHESTRATE_GPU_UUIDS, and the UUID CUDA
itself reports for device 0. Writes them as JSON to the output directory."""
import json
import os
import time

import torch

x = torch.ones(256 << 20, device="cuda")  # 1 GiB, so the device is really used
props = torch.cuda.get_device_properties(0)
seen = {
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER"),
    "ORCHESTRATE_GPU_UUIDS": os.environ.get("ORCHESTRATE_GPU_UUIDS"),
    "MASTER_PORT": os.environ.get("MASTER_PORT"),
    "cuda_uuid": "GPU-" + str(props.uuid),
    "cuda_name": props.name,
    "device_count": torch.cuda.device_count(),
}
seen["same_gpu"] = seen["cuda_uuid"] == seen["ORCHESTRATE_GPU_UUIDS"]
with open(os.path.join(os.environ["ORCHESTRATE_OUTPUT_DIR"], "which_gpu.json"), "w") as f:
    json.dump(seen, f, indent=1)
time.sleep(float(os.environ.get("HOLD_S", "0")))
