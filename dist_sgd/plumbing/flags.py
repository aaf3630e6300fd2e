"""The command line every lesson shares: --world-size, --backend, --quick (and --save-figures)."""


def lesson_parser(doc, world_size=2, save_figures=False):
    """The flags every lesson shares: --world-size, --backend, --quick (and --save-figures).

    world_size: the default. A lesson that compares world sizes passes a list (say [1, 2, 4]):
    then --world-size takes one or more (`--world-size 1 2 4`) and args.world_size is a list.
    save_figures: add --save-figures, the only way a lesson writes into the repository.
    """
    import argparse

    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    several = isinstance(world_size, (list, tuple))
    shown = " ".join(map(str, world_size)) if several else world_size
    default = list(world_size) if several else world_size
    parser.add_argument("--world-size", type=int, default=default,
                        nargs="+" if several else None, metavar="N",
                        help=f"number of ranks to spawn (default {shown}; "
                             "ignored under torchrun, which sets WORLD_SIZE)")
    parser.add_argument("--backend", choices=("gloo", "nccl", "mpi"), default=None,
                        help="default: nccl with one GPU per rank, else gloo")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: the smoke test and the lesson tour use this")
    if save_figures:
        parser.add_argument("--save-figures", action="store_true",
                            help="write this lesson's figures and CSVs into figures/")
    return parser
