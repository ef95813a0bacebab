"""TrainModule under DistributedDataParallel (gloo, 2 processes): each rank trains on half of every batch; the
averaged gradients must give the parameters a single eager process reaches on the whole batch."""
import subprocess
import sys

import torch
import torch.nn.functional as F

from conftest import ROOT
from torch_parity_models import CNN

WORKER = r'''
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
sys.path.insert(0, sys.argv[4])
from torch_parity_models import CNN
import onnxtrain.torch as ott

rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
torch.manual_seed(rank)  # different initial weights: DDP broadcasts rank 0's (seed 0) into the bound storage
model = torch.nn.parallel.DistributedDataParallel(ott.TrainModule(CNN().train()))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
gen = torch.Generator().manual_seed(5)
for step in range(4):
    x, y = torch.randn(8, 3, 12, 12, generator=gen), torch.randint(0, 5, (8,), generator=gen)
    half = slice(4 * rank, 4 * rank + 4)
    opt.zero_grad()
    F.cross_entropy(model(x[half]), y[half]).backward()
    opt.step()
torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, sys.argv[5])
dist.destroy_process_group()
'''


def test_ddp_gloo_two_processes(python_env, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", str(store), str(ROOT / "tests" / "python"),
                               str(tmp_path / f"rank{r}.pt")], env=python_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    # The reference: one eager model run on each half, gradients averaged by hand (what DDP's allreduce does).
    # In training mode BatchNorm normalises with the batch's statistics, so the parameters do not depend on the
    # running statistics (which DDP broadcasts from rank 0 before each forward).
    torch.manual_seed(0)
    ref = CNN().train()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        x, y = torch.randn(8, 3, 12, 12, generator=gen), torch.randint(0, 5, (8,), generator=gen)
        opt.zero_grad()
        grads = []
        for r in range(2):
            ref.zero_grad()
            F.cross_entropy(ref(x[4 * r:4 * r + 4]), y[4 * r:4 * r + 4]).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, g0, g1 in zip(ref.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        opt.step()
    for name, p in ref.named_parameters():
        for r in range(2):
            diff = (got[r][name] - p.detach()).abs().max() / p.detach().abs().max()
            assert diff < 1e-4, f"rank {r} {name}: {diff:.2e}"
    for name, _ in ref.named_parameters():
        assert torch.equal(got[0][name], got[1][name]), name  # both replicas hold the same weights
