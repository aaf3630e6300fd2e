"""Ghost BatchNorm: BatchNorm per simulated worker, as Goyal's per-worker BatchNorm.

With k workers each holding n items, a network's BatchNorm normalizes over each worker's own n
items (Goyal et al. keep n = 32 fixed as the global batch kn grows): the statistics, and so
the loss itself, depend on n, not on the global batch. One process simulating k workers on a
chunk of k x n items gets exactly that by reshaping (k n, features) -> (k, n, features) and
taking mean and variance over the middle axis: the same outputs and gradients as k BatchNorms
each run on its n items (tests/test_large_batch.py checks it in float64).

    bn = GhostBatchNorm1d(features, group=64)   # an nn.BatchNorm1d whose training statistics
    y = bn(x)                                    #  are per group of 64 consecutive items
    model = GhostMLP(hidden=256, group=64)       # 784-256-BN-ReLU-256-BN-ReLU-10

A batch smaller than the group is one worker's whole batch. The running statistics (for eval)
move towards the average of the groups' statistics: the average of what the k workers' own
running statistics would be, since the moving average is linear.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class GhostBatchNorm1d(nn.BatchNorm1d):
    def __init__(self, num_features, group=64, **kwargs):
        super().__init__(num_features, **kwargs)
        if group < 2:
            raise ValueError(f"GhostBatchNorm1d: group must be >= 2, got {group}")
        self.group = group

    def forward(self, x):
        if x.dim() != 2:
            raise ValueError(f"GhostBatchNorm1d: expected (batch, features), got {x.shape}")
        if not self.training:
            return super().forward(x)
        n, f = x.shape
        g = min(self.group, n)
        if n % g or g < 2:
            raise ValueError(f"GhostBatchNorm1d: a batch of {n} is not whole groups of "
                             f"{self.group} (or one group of at least 2 items)")
        xs = x.view(n // g, g, f)  # one row per simulated worker
        mean = xs.mean(1, keepdim=True)
        var = xs.var(1, unbiased=False, keepdim=True)
        y = ((xs - mean) * torch.rsqrt(var + self.eps)).view(n, f)
        if self.affine:
            y = y * self.weight + self.bias
        if self.track_running_stats:
            with torch.no_grad():
                m = self.momentum if self.momentum is not None else 0.1
                self.running_mean.mul_(1 - m).add_(m * mean.mean((0, 1)))
                # BatchNorm keeps the unbiased variance of each worker's n items
                self.running_var.mul_(1 - m).add_(m * var.mean((0, 1)) * g / (g - 1))
                self.num_batches_tracked.add_(1)
        return y


class GhostMLP(nn.Module):
    """784-hidden-BN-ReLU-hidden-BN-ReLU-10, BatchNorm per group of `group` items: 28x28
    images in, log-probabilities out. The layers before a BatchNorm need no bias."""

    def __init__(self, hidden=256, group=64, classes=10, in_features=784):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.bn1 = GhostBatchNorm1d(hidden, group)
        self.fc2 = nn.Linear(hidden, hidden, bias=False)
        self.bn2 = GhostBatchNorm1d(hidden, group)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.fc1(x.flatten(1))))
        return F.log_softmax(self.fc3(F.relu(self.bn2(self.fc2(x)))), dim=1)
