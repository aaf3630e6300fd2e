"""Leaves weight decay out of the trust ratio's denominator, trust = eta * |w| / (|g| + eps),
as the ratio is often quoted: but the paper's Algorithm 1 scales the whole step g + wd * w,
so its norm, |g| + wd * |w|, is what the ratio divides by (the lesson's formula)."""
CAUGHT_BY = "a matrix, a bias and a kernel: 4 steps, momentum 0.9, weight decay 5e-4"
HINT = "trust = trust_coefficient * |w| / (|g| + weight_decay * |w| + eps)"
PATCH = [("""                        g_norm + wd * w_norm + group["eps"])""",
          """                        g_norm + group["eps"])""")]
