"""Each rank computes its own mean and variance and the ranks average them: variances do not
average (the spread between the ranks' means is lost) and uneven local batches are weighted
equally."""
import torch
import torch.distributed as dist

CAUGHT_BY = "global_moments on uneven local batches (3, 1, 4, 2 rows)"
HINT = "means and variances do not add up across ranks"


def global_moments(x2d, eps):
    world = dist.get_world_size()
    stats = torch.cat([x2d.mean(0), x2d.var(0, unbiased=False)])
    dist.all_reduce(stats)
    stats /= world
    c = x2d.shape[1]
    n = torch.tensor(float(x2d.shape[0]), dtype=x2d.dtype)
    dist.all_reduce(n)
    mean, var = stats[:c], stats[c:]
    return mean, var, torch.rsqrt(var + eps), n


def global_means(dy2d, xhat2d, n):
    sums = torch.cat([dy2d.sum(0), (dy2d * xhat2d).sum(0)])
    dist.all_reduce(sums)
    c = dy2d.shape[1]
    return sums[:c] / n, sums[c:] / n
