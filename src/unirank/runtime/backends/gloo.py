"""The gloo backend: CPU collectives (and CUDA tensors through the host); runs everywhere.

``auto`` picks it when no other entry applies (lowest priority). Its rank's device follows the
common rule (:func:`~unirank.runtime.backends.facts.choose_device`, which binds as
:func:`unirank.gpus.device_index`): ``cpu`` without CUDA, else a GPU (made current by init), so
gloo ranks on a GPU node still compute on a GPU.
"""

from __future__ import annotations

from unirank.runtime.backends.base import Backend, torch_finalize, torch_init

__all__ = ["BACKEND"]

BACKEND = Backend(name="gloo", init=torch_init("gloo"), finalize=torch_finalize, auto_priority=0)
