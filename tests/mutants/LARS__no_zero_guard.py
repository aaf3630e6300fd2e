"""Leaves out the rule that the trust ratio is 1 where |w| or |g| is 0: a layer initialised to
zeros gets trust 0 and never moves."""
PATCH = [("                    trust = torch.where((w_norm > 0) & (g_norm > 0), trust, 1.0)\n",
          "")]
CAUGHT_BY = "a layer of zeros and a zero gradient: trust ratio 1"
HINT = "where |w| or |g| is 0 the trust ratio is 1"
