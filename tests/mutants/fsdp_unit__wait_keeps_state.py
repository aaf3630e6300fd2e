"""wait() waits for the all-gathers but leaves the state as gather() set it: the unit says
"gathering" while its parameters are all there, and the wrapper, which asks the state, waits
or gathers again. wait() makes it "gathered".

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "gather: the full weight and bias from every rank's piece"
HINT = "gather() sets self.state = \"gathering\"; wait() then makes it \"gathered\""
PATCH = [
    ("        self.works, self.state = [], \"gathered\"\n",
     "        self.works = []\n"),
]
