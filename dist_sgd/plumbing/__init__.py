"""The plumbing: what every lesson stands on, and no lesson is about. Read it last.

    launch      run fn(rank, world_size, *args) on N ranks (spawned here, or under torchrun);
                timeouts, the failing rank named, max_restarts
    rendezvous  where ranks meet: a free port, the init_method URL, the process group
    torchrun    launch() when torchrun already made this process a rank
    blame       RankError and the rank blamed: its own error over a peer's symptom of it
    leave       how a rank leaves: work in flight finished, the group destroyed, no teardown
    flags       lesson_parser: --world-size, --backend, --quick (and --save-figures)
    rank        rank(), world(), device(), log (rank 0 prints), rank_print ([rank r])
    check       max_diff and the check line every lesson prints
    timing      time_alternating: A B A B ..., medians, the slowest rank per sample
    figures     the figures' CSVs (read, write, where)
    mine        DIST_SGD_MINE=DIR: a learner's file where the library's piece was (swap_in)
    watch       a deadlock told from a busy machine: every rank asleep, seen from /proc
    cases       named cases run in one spawned group per world size: the tests' and graders'
"""
