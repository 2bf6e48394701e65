"""Gradient hooks that do not keep their owner alive.

A post-accumulate-grad hook that holds its owner (a wrapper, its buckets or
replicas) closes a cycle through autograd's C++ state: parameter -> hook ->
owner -> module -> parameter. Python's collector cannot see that edge, so the
owner, its buckets and its process group (with the backend's threads and
pending Works) would live until the interpreter exits. These hooks hold the
owner weakly, and are removed from their parameters when the owner goes.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, List

import torch
from torch.utils.hooks import RemovableHandle


class GradHooks:
    """``add(param, *args)`` makes every gradient accumulated into ``param``
    call ``method(owner, *args, param)`` while ``owner`` lives."""

    def __init__(self, owner: object, method: Callable[..., None]) -> None:
        self._owner = weakref.ref(owner)
        self._method = method
        self._handles: List[RemovableHandle] = []
        weakref.finalize(owner, _remove_all, self._handles)

    def add(self, param: torch.Tensor, *args: Any) -> None:
        owner_ref, method = self._owner, self._method

        def hook(p: torch.Tensor) -> None:
            owner = owner_ref()
            if owner is not None:
                method(owner, *args, p)

        self._handles.append(param.register_post_accumulate_grad_hook(hook))

    def remove(self) -> None:
        """Removes every hook added so far."""
        _remove_all(self._handles)


def _remove_all(handles: List[RemovableHandle]) -> None:
    for h in handles:
        h.remove()
    handles.clear()
