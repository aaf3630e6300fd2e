"""Builds the wrapped optimizer over an even chunk of the trainable parameters, n // p of them
per rank (rank r takes [r * n // p, (r + 1) * n // p)), instead of this rank's share in
self.owners: when p does not divide n, the last n % p parameters are on no rank's shard and
never step. Every trainable parameter belongs to exactly one shard: take self.owners' split."""
CAUGHT_BY = "the Adam state: each parameter's on one rank only (1/p of it per rank)"
HINT = "every trainable parameter belongs to one rank's shard"
PATCH = [("""\
        local = [self._local_group(g, o) for g, o in zip(self.param_groups, self.owners)]
""", """\
        local = []
        for g in self.param_groups:
            trainable = [p for p in g["params"] if p.requires_grad]
            per = len(trainable) // self.world_size
            local.append({**g, "params": trainable[self.rank * per:(self.rank + 1) * per]})
""")]
