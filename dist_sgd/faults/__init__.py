"""Part two, lessons 14 and 17: when a rank dies, when a node is lost or joins.

    checkpoint      checkpoints that resume bit for bit, at any world size: what is saved
    checkpoint_files  a checkpoint's files: atomic writes, checksums, `latest`
    peer_recovery   a dead rank replaced, its state sent by a live peer
    chaos           kill one worker of a running torchrun (for the lesson and the tests)
    restarts        torchrun's restart hang (torch 2.14.1), reproduced, and its work-around
    elastic         torchrun --nnodes MIN:MAX on emulated nodes: the command, a store of its
                    own, a node removed or added while the job runs (lesson 17)
"""
