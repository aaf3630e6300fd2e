"""Keeps torch's SGD form, v = m v + trust x (g + wd w), w = w - lr v: the same while lr is
constant, not when lr changes (the paper's velocity carries the rate it was taken with)."""
PATCH = [("                    step = (g + wd * p) * (lr * trust)",
          "                    step = (g + wd * p) * trust"),
         ("                    step = g * lr", "                    step = g"),
         ("                p.sub_(v)", "                p.sub_(lr * v)")]
CAUGHT_BY = "lr warming up and decaying, one step each"
HINT = "the velocity carries the learning rate"
