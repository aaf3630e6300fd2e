"""Counts the decay's milestones and cosine angle from step 0 instead of from the warmup's
end: MultiStepLR and CosineAnnealingLR used alone see the global step, but inside
SequentialLR their clock restarts when they take over."""
PATCH = [("    t = step - warmup_steps\n", "    t = step\n")]
CAUGHT_BY = "Goyal's warmup: 0.1 x 8 reached in 5 steps from 0.1, then divided by 10 twice"
HINT = "the decay's clock starts when the warmup ends"
