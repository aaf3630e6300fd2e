"""Part two, lesson 14: when a rank dies.

    checkpoint      checkpoints that resume bit for bit, atomically
    fsdp_checkpoint a FullyShardedDataParallel's state in and out, full: at any world size
    peer_recovery   a dead rank replaced, its state sent by a live peer
    chaos           kill one worker of a running torchrun (for the lesson and the tests)
"""
