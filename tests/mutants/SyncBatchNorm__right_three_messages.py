"""A correct version with one all-reduce per statistic (three messages, not one) and the
variance as the mean of squared deviations from the global mean."""
import torch
import torch.distributed as dist


def global_moments(x2d, eps):
    total = x2d.sum(0)
    n = torch.tensor([float(x2d.shape[0])], dtype=x2d.dtype)
    dist.all_reduce(total)
    dist.all_reduce(n)
    mean = total / n
    squares = ((x2d - mean) ** 2).sum(0)
    dist.all_reduce(squares)
    var = squares / n
    return mean, var, 1 / torch.sqrt(var + eps), n[0]


def global_means(dy2d, xhat2d, n):
    a, b = dy2d.sum(0), (dy2d * xhat2d).sum(0)
    dist.all_reduce(a)
    dist.all_reduce(b)
    return a / n, b / n
