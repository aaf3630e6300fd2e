"""step() calls average_parameters itself on the due steps, not self.sync(): the weights are
right, but sync() is where the averages are counted (self.syncs, which the lesson prints and
the comparison with torch's schedule reads) and where DiLoCo's outer step runs."""
CAUGHT_BY = "period 3, 7 steps: torch's PeriodicModelAverager's weights on every rank"
HINT = "average through self.sync()"
PATCH = [("        if due:\n            self.sync()\n",
          "        if due:\n            average_parameters(self.params, self.group)\n")]
