"""Reads self.state[p]["momentum_buffer"] on every step, the first included: but self.state[p]
starts as an empty dict, so the first step finds no buffer (KeyError). torch's SGD makes the
buffer on a parameter's first step, a copy of g, and reads it after that."""
CAUGHT_BY = "momentum 0.9, 4 steps: the weights and the momentum buffers"
HINT = "self.state[p] starts empty"
PATCH = [('b = state.get("momentum_buffer")', 'b = state["momentum_buffer"]')]
