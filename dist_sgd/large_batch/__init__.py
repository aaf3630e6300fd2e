"""Part three, lesson 18: what a bigger global batch does to learning, and the remedies.

    curve       reading the accuracy-against-batch curve: flat ranges, the steps fit
    schedule    the learning rate of large-batch SGD: gradual warmup, then a decay (torch's
                LinearLR + SequentialLR + MultiStepLR / CosineAnnealingLR, in one closed form)
    lars        LARS: a trust ratio per layer (You et al. 2017), a torch optimizer
    noise       the gradient noise scale B_simple from two batch sizes (McCandlish et al. 2018)
    syncbn      SyncBatchNorm from all-reduce: BatchNorm statistics over the global batch, on CPU
    ghostbn     ghost BatchNorm: BatchNorm per simulated worker, and an MLP with it
"""
