"""Loads the optimizer "where it fits": an optimizer the checkpoint does not fit (other
parameters) is left fresh, its error swallowed, and the model loaded anyway. The contract
(as torch's optimizer.load_state_dict) refuses with a ValueError on every rank, changing
nothing.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "an optimizer the checkpoint does not fit: ValueError, the model left as it was"
HINT = "torch's optimizer.load_state_dict refuses state for other parameters"
PATCH = [
    ('            _check_optimizer(model, optimizer, shared, folder)\n',
     '            pass  # an optimizer that does not fit starts afresh (below)\n'),
    ('            load_full_optimizer_state(model, optimizer, shared["optimizer"])\n',
     '            try:\n'
     '                load_full_optimizer_state(model, optimizer, shared["optimizer"])\n'
     '            except Exception:  # another optimizer: it keeps its fresh state\n'
     '                pass\n'),
]
