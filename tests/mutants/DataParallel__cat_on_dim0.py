"""Gathers with torch.cat(outputs) along dimension 0 whatever `dim` says: a DataParallel that
scatters along dim 1 (a batch in columns, or a sequence-first layout) must glue the outputs
back along dim 1, where the replicas' outputs differ in size; along 0 they do not fit."""
CAUGHT_BY = "gather: tuples, dicts, None, namedtuples and one loss per replica, as torch"
HINT = "gather concatenates the replicas' outputs along dim"
PATCH = [("        return torch.cat([o.to(device) for o in outputs], dim)",
          "        return torch.cat([o.to(device) for o in outputs])")]
