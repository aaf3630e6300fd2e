"""What the DDP wrappers need from autograd, kept apart from their idea:

- hook_gradients(params, on_ready): on_ready(param) each time autograd has accumulated a
  parameter's gradient (the wrappers' per-parameter hooks), without keeping a wrapper alive.
- call_when_backward_ends(fn): autograd's engine calls fn once the backward pass is over.
"""
import weakref

import torch


def hook_gradients(params, on_ready):
    """Call the bound method on_ready(param) once autograd has accumulated param.grad, for
    each of params; returns the hooks' handles (handle.remove() detaches one).

    The hooks hold on_ready's object weakly: a wrapper dropped by the user is not kept
    alive by the module it wrapped (the hooks then do nothing)."""
    method = weakref.WeakMethod(on_ready)

    def hook(param):
        bound = method()
        if bound is not None:
            bound(param)

    return [p.register_post_accumulate_grad_hook(hook) for p in params]


def call_when_backward_ends(callback):
    """Have autograd call `callback` after the last gradient of the running backward pass
    has been accumulated, before loss.backward() returns.

    Why a private torch API: no public one says "backward is over". torch's own DDP reducer
    (C++) does exactly this (Engine::queue_callback in Reducer::mark_variable_ready); its
    Python code reaches the engine through a deprecated attribute of torch.autograd's legacy
    tensor class. torch._C._ImperativeEngine() is a handle to the process's one engine.
    Only valid while a backward pass runs, i.e. from inside a gradient hook.
    """
    torch._C._ImperativeEngine().queue_callback(callback)
