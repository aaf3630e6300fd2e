"""Reads the trust coefficient from the optimizer's defaults: right with one param group, wrong
for a group added with its own trust_coefficient.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""
CAUGHT_BY = "two param groups with their own options; a parameter with no gradient"
HINT = "each param group has its own trust_coefficient"
PATCH = [("""                    trust = group["trust_coefficient"] * w_norm / (""",
          """                    trust = self.defaults["trust_coefficient"] * w_norm / (""")]
