"""Calls torch.distributed's all_gather itself instead of self.comm.start: it works,
but FSDP's bytes_per_step() no longer counts what the unit sends.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the wrong version follows the reference as it changes."""

CAUGHT_BY = 'the collectives go through self.comm.start, where FSDP counts its bytes'
HINT = "start each collective with"
PATCH = [
    ('import torch\nfrom dist_sgd.shard.fsdp_unit import _Gather, itemsize\n',
     'import torch\nimport torch.distributed as dist\nfrom dist_sgd.shard.fsdp_unit import _Gather, itemsize\n'),
    ('            work = self.comm.start("all_gather", list(flat.split(s.size)), piece)\n',
     '            work = dist.all_gather(list(flat.split(s.size)), piece, async_op=True)\n'),
]
