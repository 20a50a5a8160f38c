"""Names for the Ray objects the worker groups hold and pass around.

``ActorHandle``: an actor started with ``ray.remote(cls).options(...).remote(...)``.
Its methods are looked up by name when called (``handle.method.remote(...)``),
which Ray's own ``ray.actor.ActorHandle`` cannot type: its ``__getattr__``
returns ``Never``, and an actor class's methods are typed as the plain
functions, without ``.remote``. So a handle is left untyped, under this one
name, wherever it is held. ``ActorClass`` likewise stands for the class a
handle is made from, where mypy would otherwise take the handle's type from
Ray's (``ActorHandle[T] | type[T]``, whose methods have no ``.remote``).

``RayOptions``: the keyword arguments ``ray.remote`` takes besides the CPUs (a
device's ``DeviceSpec.ray_resource``: ``{"num_gpus": 1}``, ``{"resources":
{"NPU": 1}}`` or ``{}``), values of several types passed on as ``**options``.

``Scheduling``: where one worker runs (a placement-group bundle from
``rlpost.workers.placement``); None lets Ray choose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ActorHandle: TypeAlias = Any
ActorClass: TypeAlias = Any
RayOptions: TypeAlias = dict[str, Any]
Scheduling: TypeAlias = "PlacementGroupSchedulingStrategy | None"
