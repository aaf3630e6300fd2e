"""What comes out of a FullyShardedDataParallel whole: its full parameters, gathered.

Checkpoints (state_dict in and out, full at any world size) are in
dist_sgd/faults/fsdp_checkpoint.py, which gathers through _whole too.
"""
import torch


def _whole(fsdp, piece, s):
    """Every rank's `piece` of shard s, gathered, trimmed and shaped like the parameter."""
    pieces = [torch.empty_like(piece) for _ in range(fsdp.world_size)]
    fsdp.comm.start("all_gather", pieces, piece.detach().contiguous(), count=False).wait()
    return torch.cat(pieces)[:s.numel].view(s.shape)


def gather_full_params(fsdp):
    """{name: full parameter} under the plain module's names (every rank calls, and gets it)."""
    shard_of = {id(s.param): s for s in fsdp.shards_by_name.values()}
    return {name: _whole(fsdp, p, shard_of[id(p)]) if id(p) in shard_of else p.detach().clone()
            for name, p in fsdp.module.named_parameters()}
