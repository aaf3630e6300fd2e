"""Counts in gather() the bytes of the pieces it sends, not of the full storages it fills:
the memory held while gathered is self.nbytes (every rank's piece, padding included), p times
a piece.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "gather: the full weight and bias from every rank's piece"
HINT = "self.memory.count(self.nbytes) in gather()"
PATCH = [
    ("            self.works.append((work, piece))  # the piece stays alive"
     " until the gather is done\n",
     "            self.works.append((work, piece))  # the piece stays alive"
     " until the gather is done\n"
     "            self.memory.count(piece.numel() * piece.element_size())\n"),
    ("        self.state = \"gathering\"\n        self.memory.count(self.nbytes)\n",
     "        self.state = \"gathering\"\n"),
]
