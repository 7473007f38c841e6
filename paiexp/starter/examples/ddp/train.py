"""Train a small regression model with PyTorch DDP, under the PAI training-job contract.

Started by ``torchrun`` on every instance of a multi-instance job, as PAI's own tutorial does
(``torchrun --nnodes=$WORLD_SIZE --node_rank=$RANK --nproc_per_node=$NPROC_PER_NODE
--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT train.py``): each process trains on its
own shard of a synthetic data set, DDP averages the gradients (gloo on CPUs, nccl on GPUs), so
every process ends with the same parameters.  Rank 0 alone prints the loss of each epoch
(``epoch 3 loss=0.0123``, the job's metric) and writes the model to the ``model`` channel;
every process prints a checksum of its final parameters (``rank 1 checksum=<sha256>``).
Works with PyTorch 1.13 (Debian bookworm's python3-torch) and later.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 8
SAMPLES = 256  # of the whole data set, split between the processes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def data(rank: int, world: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This process's shard of ``y = x . w + noise`` (the same data set in every process)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, 1, generator=generator)
    y = x @ weights + 0.01 * torch.randn(SAMPLES, 1, generator=generator)
    return x[rank::world], y[rank::world]


def checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun's RANK, WORLD_SIZE, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)  # DDP broadcasts rank 0's initial parameters anyway
    model = DistributedDataParallel(
        torch.nn.Linear(FEATURES, 1).to(device), device_ids=[device.index] if cuda else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    x, y = (tensor.to(device) for tensor in data(rank, world, args.seed))
    for epoch in range(args.epochs):
        total = torch.zeros(2, device=device)  # this process's summed loss, and its samples
        for start in range(0, len(x), args.batch_size):
            batch_x, batch_y = (
                x[start : start + args.batch_size],
                y[start : start + args.batch_size],
            )
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch_x), batch_y)
            loss.backward()  # DDP averages the gradients of every process here
            optimizer.step()
            total += torch.tensor([loss.item() * len(batch_x), len(batch_x)], device=device)
        dist.all_reduce(total)  # the epoch's loss over every process's samples
        if rank == 0:
            print(f"epoch {epoch} loss={(total[0] / total[1]).item():.6f}", flush=True)
    print(f"rank {rank} checksum={checksum(model)}", flush=True)
    if rank == 0:
        path = os.path.join(os.environ.get("PAI_OUTPUT_MODEL", "."), "model.pt")
        torch.save(model.module.state_dict(), path)
        print(f"rank 0 wrote the model to {path}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
