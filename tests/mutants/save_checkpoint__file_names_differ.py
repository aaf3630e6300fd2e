"""load_checkpoint looks for the shared file under another name than save_checkpoint gave it
("model.pt" read, "shared.pt" written): the two functions written apart. Whatever names save
chooses, load must read those same files, or there is nothing to load.

Written as changes to the reference (dist_sgd/course/skeleton.reference)."""

CAUGHT_BY = "saved, then loaded into a fresh model: weights, momentum, learning rate"
HINT = "load_checkpoint reads what save_checkpoint wrote: the same folder and"
PATCH = [
    ('        shared = _read(os.path.join(folder, "shared.pt"), listed)\n',
     '        shared = _read(os.path.join(folder, "model.pt"), listed)\n'),
]
