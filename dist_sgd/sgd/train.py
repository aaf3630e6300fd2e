"""What lessons and tests reuse around a training loop (the loop itself is on lesson 06's page).

    b = per_rank_batch(64, world_size)              # 64 // world_size, or a clear error
    loader = shard_loader(train_set, 64)            # ShardSampler + the per-rank batch
    log(format_test(evaluate(model, test_set)))     # the classic example's test line

Everything works with or without a process group (without one: a single process).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, default_collate

from dist_sgd.plumbing.rank import device, world
from dist_sgd.sgd.partition import ShardSampler


def per_rank_batch(global_batch, world_size):
    """The batch each rank uses so that the ranks together process `global_batch` items."""
    for name, v in (("global batch", global_batch), ("world size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if global_batch % world_size:
        lo = global_batch // world_size * world_size
        raise ValueError(
            f"global batch {global_batch} does not divide evenly over {world_size} ranks "
            f"({global_batch} / {world_size} = {global_batch / world_size:g} items per rank); "
            f"use a multiple of {world_size}, e.g. {lo or world_size} or {lo + world_size}")
    return global_batch // world_size


def shard_loader(dataset, global_batch, shuffle=True, seed=0, drop_last=False):
    """A DataLoader over this rank's shard (ShardSampler) with the per-rank batch size."""
    rank, world_size = world()
    sampler = ShardSampler(dataset, world_size, rank, shuffle=shuffle, seed=seed,
                           drop_last=drop_last)
    return DataLoader(dataset, batch_size=per_rank_batch(global_batch, world_size), sampler=sampler)


@torch.no_grad()
def evaluate(model, dataset, batch_size=1000, loss_fn=F.nll_loss):
    """Loss and accuracy on the whole `dataset`, the work shared out over the ranks.

    Rank r takes items r, r + R, ... (no padding, so nothing is counted twice) and the sums
    are all-reduced: every rank returns the same {"loss", "correct", "total", "accuracy"}.
    """
    rank, world_size = world()
    model.eval()  # dropout off: the test score must not depend on random masks
    dev = device()
    sums = torch.zeros(3, dtype=torch.float64, device=dev)  # loss sum, correct, count
    mine = torch.arange(rank, len(dataset), world_size)  # on the CPU: indices into the dataset
    for chunk in mine.split(batch_size):
        if isinstance(dataset, TensorDataset):
            data, target = dataset[chunk]  # one gather, not one call per item
        else:
            data, target = default_collate([dataset[i] for i in chunk.tolist()])
        data, target = data.to(dev), target.to(dev)
        output = model(data)
        sums[0] += loss_fn(output, target, reduction="sum").item()
        sums[1] += (output.argmax(dim=1) == target).sum().item()
        sums[2] += len(target)
    if world_size > 1:
        dist.all_reduce(sums)
    loss, correct, total = sums.tolist()
    return {"loss": loss / max(total, 1), "correct": int(correct), "total": int(total),
            "accuracy": correct / max(total, 1)}


def format_test(result):
    """The example's test report ("Test set: Average loss: ..., Accuracy: c/n (p%)")."""
    return "Test set: Average loss: {:.4f}, Accuracy: {}/{} ({:.2f}%)".format(
        result["loss"], result["correct"], result["total"], 100.0 * result["accuracy"])


def scaled_lr(base_lr, base_batch, global_batch, step=None, warmup_steps=0):
    """The linear scaling rule with gradual warm-up (Goyal et al. 2017).

    lr = base_lr * global_batch / base_batch; during the first warmup_steps steps it ramps
    linearly from base_lr up to that value (large lr at the very start diverges).
    """
    target = base_lr * global_batch / base_batch
    if step is None or warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


def flat_parameters(model):
    """All parameters as one detached float64 vector (to compare or checksum replicas)."""
    return torch.cat([p.detach().reshape(-1).to(torch.float64).cpu() for p in model.parameters()])


def max_diff_across_ranks(model):
    """max |w_r - w_0| over all ranks r and all weights: 0.0 when the replicas are identical."""
    _, world_size = world()
    mine = flat_parameters(model).to(device())
    if world_size == 1:
        return 0.0
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    return max((w - everyone[0]).abs().max().item() for w in everyone)
