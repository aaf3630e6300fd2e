"""Warms up from 0 (lr = peak x step / warmup_steps), as many tutorials' "linear warmup"
does: Goyal's starts at the small batch's rate, start_factor x peak_lr."""
PATCH = [("return peak_lr * (start_factor + (1 - start_factor) * step / warmup_steps)",
          "return peak_lr * step / warmup_steps")]
CAUGHT_BY = "Goyal's warmup: 0.1 x 8 reached in 5 steps from 0.1, then divided by 10 twice"
HINT = "the warmup starts at start_factor x peak_lr"
