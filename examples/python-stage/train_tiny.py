"""A worked example of a Python stage: trains a tiny PyTorch model (CPU or GPU), resumes from
an earlier attempt's checkpoint, reports progress, a checkpoint and metrics through
python/orchestrate_stage.py. See plan.toml beside it."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import orchestrate_stage as stage  # noqa: E402
import torch  # noqa: E402

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
x = torch.randn(512, 8, device=device)
y = x @ torch.arange(1.0, 9.0, device=device) + 0.5
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
out = stage.output_dir()
start = 0
resume = stage.resume_dir()
if resume and (resume / "model.pt").exists():
    state = torch.load(resume / "model.pt")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
stage.started(device=device)
t0 = time.time()
for step in range(start, steps):
    loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if (step + 1) % 50 == 0 or step + 1 == steps:
        stage.progress(step + 1, total_steps=steps, loss=loss.item())
tmp = out / "model.pt.tmp"
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": steps}, tmp)
os.replace(tmp, out / "model.pt")
stage.checkpoint(out / "model.pt", step=steps)
stage.metrics(final_loss=loss.item(), steps=steps, train_wall_s=time.time() - t0)
