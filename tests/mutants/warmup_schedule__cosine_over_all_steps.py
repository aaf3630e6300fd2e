"""Gives the cosine total_steps as its period, T = total_steps: but the cosine takes over when
the warmup ends, so it has total_steps - warmup_steps steps to reach eta_min (torch's
CosineAnnealingLR inside SequentialLR gets T_max = total_steps - warmup_steps, and its clock
restarts there)."""
CAUGHT_BY = "a 7-step warmup, then a cosine to eta_min and past T_max"
HINT = "the cosine's period is T = total_steps - warmup_steps"
PATCH = [("        period = total_steps - warmup_steps\n", "        period = total_steps\n")]
