"""With no checkpoint yet, load_checkpoint returns {"step": 0} ("start from the beginning"),
where its contract says None: a caller cannot tell a first run from a run resumed at step 0,
and nothing was loaded.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "an empty folder: load_checkpoint returns None and changes nothing"
HINT = "a first run finds no checkpoint: return None"
PATCH = [
    ('    if folder is None:\n        return None\n',
     '    if folder is None:\n'
     '        return {"step": 0}  # nothing saved: start at the beginning\n'),
]
