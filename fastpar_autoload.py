"""The torch.distributed backend "fastpar" in processes that never import fastpar.

An installed fastpar declares one entry point (pyproject.toml): group
``torch.distributed.backends`` -> ``on_demand``. torch versions that have this
group (2.14) call it the first time a process asks for the backend "fastpar"
by name (init_process_group, new_group, is_backend_available); ``import
torch`` itself never loads anything of fastpar. What gets registered is
``_create``, which imports fastpar (the compiled extension, the creator in
fastpar/distributed/backend.py) only when torch first builds a fastpar group.
``register`` is the one registration: ``import fastpar`` calls it too, and it
does nothing when the backend is registered already.

There is no ``torch.backends`` entry point (torch 2.5+ loads that group during
every ``import torch`` and fails the import when loading raises): a fastpar
whose module is gone, e.g. an editable install whose checkout moved, must not
break torch for every program of the environment. On torch without the
on-demand group a process registers the backend with ``import fastpar``.

Turned off by FASTPAR_AUTOLOAD=0 or by torch's own TORCH_DEVICE_BACKEND_AUTOLOAD=0
(then only ``import fastpar`` registers the backend).

This module lives outside the fastpar package on purpose: importing
``fastpar.<anything>`` first runs fastpar/__init__.py, which loads the
extension. Keep its imports to the standard library and torch.distributed.
"""
import os

BACKEND_NAME = "fastpar"


def enabled() -> bool:
    """Whether fastpar may load itself (FASTPAR_AUTOLOAD, TORCH_DEVICE_BACKEND_AUTOLOAD)."""
    # TORCH_DEVICE_BACKEND_AUTOLOAD is read as torch reads it: on only while unset or "1".
    return (os.environ.get("FASTPAR_AUTOLOAD", "1") != "0"
            and os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1")


def _create(dist_opts, backend_options=None):
    """The extended-API creator torch calls for each fastpar group."""
    from fastpar.distributed.backend import _create_from_options
    return _create_from_options(dist_opts, backend_options)


def register() -> None:
    """Registers "fastpar" with torch.distributed for CPU and CUDA tensors (idempotent)."""
    import torch.distributed as dist
    if not dist.is_available() or BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def on_demand() -> None:
    """Entry point ``torch.distributed.backends``: a process asked for "fastpar"."""
    if not enabled():
        # torch requires the entry point to register or fail; say why it did not.
        raise RuntimeError(
            f"Unknown backend '{BACKEND_NAME}': fastpar is installed but does not load itself when "
            f"FASTPAR_AUTOLOAD=0 or TORCH_DEVICE_BACKEND_AUTOLOAD=0 (they are "
            f"{os.environ.get('FASTPAR_AUTOLOAD', 'unset')} and "
            f"{os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD', 'unset')}); import fastpar before "
            f"creating the process group")
    register()

