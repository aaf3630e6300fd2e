"""Lesson 00: the training loop we are going to distribute, in one process.

Before splitting training over processes we write it out once, whole, with nothing hidden:
every later lesson changes one piece of this loop. In the order of the PyTorch training
survey in shared/reference:
  1. tensors and autograd: tensors that record the operations done to them, so that
     backward() can compute gradients,
  2. nn.Module: a network is a module holding parameters (Net: the classic MNIST convnet of
     the old gloo example, 21,840 parameters),
  3. Dataset and DataLoader: the data, batched and shuffled (dist_sgd.sgd.data picks MNIST if it
     can download it, else Fashion-MNIST from local files, and says which and why),
  4. weight initialization through module.apply(init_weights),
  5. the loop: forward, loss (F.nll_loss: Net outputs log-probabilities), backward, and the
     weight update written by hand,  p -= lr * p.grad  under torch.no_grad(), checked
     against torch.optim.SGD step for step,
  6. a short training run and the accuracy on the test set.

Distributed data-parallel SGD (lessons 05-06) keeps all of this and adds one line between
backward and the update: average the gradients over the ranks.

Run it (from the repository root):
    python lessons/00_single_process.py            # one epoch, ~15-30 s on 2 cores
    python lessons/00_single_process.py --quick    # a few seconds
    torchrun --standalone --nproc-per-node 1 lessons/00_single_process.py
(One process: --world-size is accepted for uniformity and ignored.)

Exercises:
  1. Write the update as p.add_(p.grad, alpha=-lr), the fused multiply-add torch uses:
     the max difference to torch.optim.SGD becomes exactly 0. Why not with p -= lr * p.grad?
  2. Drop the torch.manual_seed calls before the two forward passes: how large does the
     difference get, and why? (Dropout.)
  3. Add momentum by hand (v = mu * v + grad; p -= lr * v) and compare it with
     torch.optim.SGD(momentum=mu).
  4. Remove model.zero_grad(): what happens to the gradients, and to training?
"""
import copy
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from dist_sgd.plumbing.check import check, max_diff
from dist_sgd.sgd.data import get_dataset
from dist_sgd.plumbing.launch import lesson_parser
from dist_sgd.sgd.models import Net, count_parameters, init_weights

LR, BATCH = 0.05, 64


def autograd_demo():
    print("--- 1. tensors and autograd ---")
    x = torch.randn(4, 4, requires_grad=True)  # a leaf: autograd will fill x.grad
    z = (2 * x).sum()  # every operation is recorded in a graph: z.grad_fn
    z.backward()  # dz/dx, through the graph
    print(f"z = (2 * x).sum(); z.grad_fn = {type(z.grad_fn).__name__}; after z.backward(), "
          f"x.grad is all {x.grad.unique().tolist()}")
    print("  " + check("x.grad vs d/dx of sum(2x), which is 2 everywhere",
                       max_diff(x.grad, torch.full((4, 4), 2.0)), 0))


def manual_step(model, lr):
    """The update, written out: p <- p - lr * grad. no_grad: the update itself must not be
    recorded by autograd (and may change a leaf that requires grad in place)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def step(model, x, y, seed):
    """forward, loss, backward. Reseeding makes dropout draw the same masks in two models."""
    torch.manual_seed(seed)
    loss = F.nll_loss(model(x), y)
    model.zero_grad()  # gradients accumulate (+=) across backward() calls: clear them first
    loss.backward()
    return loss.item()


def accuracy(model, dataset, limit=None):
    model.eval()  # dropout off: at test time we want the whole network
    n = len(dataset) if limit is None else min(limit, len(dataset))
    correct = 0
    with torch.no_grad():
        for start in range(0, n, 1000):
            x, y = dataset[start:min(start + 1000, n)]
            correct += (model(x).argmax(1) == y).sum().item()
    model.train()
    return correct / n


def main():
    args = lesson_parser(__doc__, world_size=1).parse_args()
    torch.set_num_threads(1)  # like every rank later: one core per process
    compare_steps, train_steps = (10, 100) if args.quick else (50, None)  # None: one epoch
    autograd_demo()

    print("\n--- 2. nn.Module ---")
    torch.manual_seed(0)
    model = Net()
    for name, p in model.named_parameters():
        print(f"  {name:14s} {str(tuple(p.shape)):16s} {p.numel():6,d} parameters")
    print(f"  Net: {count_parameters(model):,} parameters; out = model(images) gives "
          "log-probabilities, shape (batch, 10)")

    print("\n--- 3. Dataset and DataLoader ---")
    train, test = get_dataset(train=True), get_dataset(train=False, quiet=True)
    loader = DataLoader(train, batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(0))  # reproducible shuffling
    x, y = next(iter(loader))
    print(f"  one batch: images {tuple(x.shape)} {x.dtype}, labels {tuple(y.shape)} {y.dtype}; "
          f"{len(loader)} batches of {BATCH} per epoch")

    print("\n--- 4. weight initialization: model.apply(init_weights) ---")
    model.apply(init_weights)  # apply() visits every submodule: conv1, conv2, fc1, fc2, ...
    print(f"  conv1.weight std {model.conv1.weight.std().item():.3f} (Kaiming normal, fan_out), "
          f"conv1.bias all zero: {bool((model.conv1.bias == 0).all())}")

    print(f"\n--- 5. the loop: manual update vs torch.optim.SGD(lr={LR}), {compare_steps} "
          "steps ---")
    reference = copy.deepcopy(model)  # same starting weights
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for i, (x, y) in enumerate(loader):
        if i == compare_steps:
            break
        loss = step(model, x, y, seed=i)
        manual_step(model, LR)
        step(reference, x, y, seed=i)  # same batch, same dropout masks
        optimizer.step()
    print(f"  after {compare_steps} steps (loss {loss:.3f}):")
    print("  " + check("weights, manual update vs torch.optim.SGD", max_diff(model, reference),
                       1e-5))
    print("  equal up to float rounding: torch computes p + (-lr) * grad in one fused "
          "multiply-add, we round lr * grad first (exercise 1); over thousands of steps "
          "such 1e-7 differences grow, as any change does in training")

    print(f"\n--- 6. training: {train_steps or len(loader)} steps of batch {BATCH} ---")
    start, seen = time.perf_counter(), 0
    for i, (x, y) in enumerate(loader):  # a fresh shuffle: the DataLoader reshuffles per epoch
        if train_steps is not None and i == train_steps:
            break
        loss = step(model, x, y, seed=1000 + i)
        manual_step(model, LR)
        seen += len(x)
        if i % 200 == 0:
            print(f"  step {i:4d}  loss {loss:.3f}")
    seconds = time.perf_counter() - start
    limit = 2000 if args.quick else None
    acc = accuracy(model, test, limit)
    print(f"  {seen:,} images in {seconds:.1f} s ({seen / seconds:,.0f} images/s on one core); "
          f"test accuracy {acc:.1%} on {limit or len(test):,} {train.name} test images "
          "(chance: 10%)")


if __name__ == "__main__":
    main()
