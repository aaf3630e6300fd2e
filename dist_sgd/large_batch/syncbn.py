"""SyncBatchNorm from all-reduce: BatchNorm's statistics over the global batch, on any device.

Under data parallelism each rank's BatchNorm normalizes with the mean and variance of its own
local batch. Goyal et al. keep that on purpose (per-worker statistics over n = 32 images); but
when the local batch is small (detection, segmentation, big models with 1-2 images per GPU) the
statistics are too noisy, and one wants those of the global batch. Per channel c:

    forward:  all-reduce (sum x, sum x^2, count) -> mean, var = E[x^2] - mean^2 (global)
              y = (x - mean) / sqrt(var + eps) x weight + bias
    backward: all-reduce (sum dy, sum dy xhat) -> the input gradient's two global means:
              dx = weight / sqrt(var + eps) x (dy - mean(dy) - xhat mean(dy xhat))

Why sums and not means, what stays local, and how it stands beside torch's (which refuses
CPU tensors): SyncBatchNorm's docstring.
"""
import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from dist_sgd.plumbing.mine import swap_in


def _channels_last_2d(x):
    """(N, C, *) -> (N x *, C): every item and position a row, every channel a column."""
    return x.transpose(0, 1).reshape(x.shape[1], -1).t()


def global_moments(x2d, eps):
    """(mean, biased var, invstd, count) per channel over every rank's rows.

    x2d: this rank's rows (local batches may differ in size), one column per channel. mean,
    var (biased: divided by the global count, as BatchNorm normalizes) and invstd = 1 /
    sqrt(var + eps) are tensors of one value per channel, in x2d's dtype; count is the global
    number of rows as a one-element tensor of x2d's dtype (forward saves it for backward and
    passes it to global_means). Every rank returns the same values; x2d is left as it is."""
    # ---- exercise SyncBatchNorm: mean, variance, 1/std and count over every rank's rows
    count = torch.full((1,), x2d.shape[0], dtype=x2d.dtype, device=x2d.device)
    stats = torch.cat([x2d.sum(0), (x2d * x2d).sum(0), count])
    dist.all_reduce(stats)  # one message: sums, sums of squares and counts add up
    c = x2d.shape[1]
    total, n = stats[:c], stats[2 * c]
    mean = total / n
    var = (stats[c:2 * c] / n - mean * mean).clamp_(min=0)
    return mean, var, torch.rsqrt(var + eps), n
    # ---- end of exercise


def global_means(dy2d, xhat2d, n):
    """mean(dy) and mean(dy xhat) per channel over every rank's rows (backward's all-reduce).

    n: the count global_moments returned (a one-element tensor). dy2d and xhat2d are left as
    they are: backward uses dy2d again after this."""
    # ---- exercise SyncBatchNorm: the global means of dy and of dy * xhat
    sums = torch.cat([dy2d.sum(0), (dy2d * xhat2d).sum(0)])
    dist.all_reduce(sums)
    c = dy2d.shape[1]
    return sums[:c] / n, sums[c:] / n
    # ---- end of exercise


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x2d = _channels_last_2d(x)
        mean, var, invstd, n = global_moments(x2d, eps)
        if n.item() <= 1:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel when "
                             f"training, got a global batch of {int(n.item())}")
        xhat = (x2d - mean) * invstd
        y = xhat * weight + bias if weight is not None else xhat
        ctx.save_for_backward(xhat, invstd, weight, n)
        ctx.shape = x.shape
        out = y.t().reshape(x.shape[1], x.shape[0], *x.shape[2:]).transpose(0, 1)
        return out.contiguous(), mean, var, n

    @staticmethod
    def backward(ctx, dy, _mean, _var, _n):
        xhat, invstd, weight, n = ctx.saved_tensors
        dy2d = _channels_last_2d(dy)
        dweight = (dy2d * xhat).sum(0) if weight is not None else None
        dbias = dy2d.sum(0) if weight is not None else None
        mean_dy, mean_dy_xhat = global_means(dy2d, xhat, n)
        scale = invstd * weight if weight is not None else invstd
        dx2d = (dy2d - mean_dy - xhat * mean_dy_xhat) * scale
        shape = ctx.shape
        dx = dx2d.t().reshape(shape[1], shape[0], *shape[2:]).transpose(0, 1).contiguous()
        return dx, dweight, dbias, None


class SyncBatchNorm(_BatchNorm):
    """torch.nn.SyncBatchNorm's arguments (process_group: the default group only).

    Sums and sums of squares add up across ranks, means and variances do not (averaging the ranks'
    variances forgets how far their means lie apart, and averaging their means is wrong when local
    batches differ in size). Both terms of the input gradient depend on every rank's items, so
    backward needs its own all-reduce. weight.grad and bias.grad stay local: DDP averages them with
    the other gradients. Running statistics use the global batch's unbiased variance, as BatchNorm
    on the global batch would.

    torch.nn.SyncBatchNorm refuses CPU tensors ("expected input tensor to be on GPU"): this one
    is what a CPU (gloo) user can run. Same arguments, and `SyncBatchNorm.convert_sync_batchnorm
    (module)` swaps every BatchNorm of a model for it, as torch's does. Outside a process group, in
    eval mode or at world size 1 it is plain BatchNorm, as torch's is. Equal to BatchNorm on the
    global batch in one process (outputs, gradients, running statistics, uneven local batches) and
    to torch's SyncBatchNorm on a GPU: tests/test_large_batch.py and tests/test_gpu.py.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None):
        if process_group is not None:
            raise TypeError("SyncBatchNorm: process_group= is not supported (the default group "
                            "only)")
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x):
        self._check_input_dim(x)
        if x.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}): input has {x.shape[1]} "
                             "channels")
        # As torch's: only training synchronizes (in eval, without running statistics, each
        # rank normalizes with its own batch's)
        synced = self.training and dist.is_available() and dist.is_initialized() and \
            dist.get_world_size() > 1
        if not synced:  # one process, or eval: BatchNorm itself
            return super().forward(x)
        momentum = self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if momentum is None:  # a cumulative average, as BatchNorm's momentum=None
                momentum = 1.0 / float(self.num_batches_tracked)
        y, mean, var, n = _SyncBatchNormFunction.apply(x, self.weight, self.bias, self.eps)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                unbiased = var.detach() * (n / (n - 1))
                self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        return y

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Every BatchNorm*d in `module` replaced by a SyncBatchNorm with its weights, running
        statistics and mode (torch's classmethod, for ours); returns the converted module."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group)
            if module.affine:
                with torch.no_grad():
                    out.weight, out.bias = module.weight, module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        del module
        return out


# DIST_SGD_MINE: a learner's version replaces this one
swap_in(globals(), "SyncBatchNorm", ("global_moments", "global_means"), lesson="18")
