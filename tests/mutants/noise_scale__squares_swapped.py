"""Eliminates tr(Sigma) with the squared norms on the wrong sides, g2 = (b_big * small_sq -
b_small * big_sq) / (b_big - b_small): multiplying small_sq = g2 + tr / b_small by b_small and
big_sq = g2 + tr / b_big by b_big, then subtracting, puts each batch size with its own norm."""
CAUGHT_BY = "exact expectations at batch sizes 8 and 64 give back |G|^2 and tr(Sigma)"
HINT = "two equations, small_sq = g2 + tr / b_small"
PATCH = [("g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)",
          "g2 = (b_big * small_sq - b_small * big_sq) / (b_big - b_small)")]
