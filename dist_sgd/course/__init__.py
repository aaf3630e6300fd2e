"""The course: write each piece yourself; the project's own proofs grade it (every lesson).

    __main__    python3 -m dist_sgd.course: list, start, check [--watch], hint, progress
    exercises   the exercises in the lessons' order, found by name or lesson (get, select)
    registry    every exercise: its lesson, reference, what the learner writes, its hints
    exercise    what an exercise is: its fields, where its reference, grader and lesson live
    skeleton    the learner's file, generated from the reference's marked region
    grade       cases run inside spawned ranks, each failure one line to act on
    context     what a case sees in its rank: the piece, the expectations, the watch on calls
    graders/    one grader per exercise, named as the exercise
"""
