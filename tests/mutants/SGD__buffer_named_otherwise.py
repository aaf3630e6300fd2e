"""Keeps the momentum buffer in self.state[p]["buffer"]: the steps are right, but torch's SGD
names it "momentum_buffer", and a state_dict saved from one optimizer then gives the other no
momentum (a checkpoint from torch.optim.SGD restarts ours with none, and the other way)."""
CAUGHT_BY = "momentum 0.9, 4 steps: the weights and the momentum buffers"
HINT = "a state_dict then loads into either optimizer"
PATCH = [('b = state.get("momentum_buffer")', 'b = state.get("buffer")'),
         ('b = state["momentum_buffer"] = g', 'b = state["buffer"] = g')]
