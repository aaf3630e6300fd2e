"""Raises the rate once per 'epoch' of 2 steps, a staircase: Goyal's warmup rises at every
iteration (a constant warmup, or a coarse one, spikes the error)."""
PATCH = [("return peak_lr * (start_factor + (1 - start_factor) * step / warmup_steps)",
          "return peak_lr * (start_factor + (1 - start_factor) * (step // 2 * 2) / warmup_steps)")]
CAUGHT_BY = "Goyal's warmup: 0.1 x 8 reached in 5 steps from 0.1, then divided by 10 twice"
HINT = "the rate rises at every step of the warmup"
