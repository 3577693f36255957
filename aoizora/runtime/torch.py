"""Apply a torch plan: a ``DeviceMesh`` in the planned device order, and the captured program
run laid out by the plan (``aoizora.runtime.torch_layout.LayoutRunner``) under
``torch.distributed``.

    ep = capture(model, example_inputs, kwargs)          # the model with its weights
    program = PlannedProgram(plan, ep)                    # in every rank, after init_process_group
    out = program(*example_inputs)                        # full (unsharded) outputs on every rank

Device order: logical rank i of the plan's mesh (``plan.device_order[i]``) is the global rank
that runs it; on GPUs rank r drives device r (``CUDA_VISIBLE_DEVICES`` per process, or
``torch.cuda.set_device(local_rank)``), so the plan's order is the mesh's order of ranks. The
linear layers' weights, the attention inputs and every other input are laid out as the plan
says (DTensor ``Shard`` / ``Replicate`` per mesh dimension); attention runs sequence-parallel
(Ulysses all-to-all or gathered keys) where DTensor has no rule of its own.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from aoizora.extract.frontends.torch.capture import graph_digest, input_shapes
from aoizora.runtime.torch_layout import LayoutRunner, TorchLayoutError


def plan_mesh(plan, device_type: str = "cpu") -> DeviceMesh:
    """The plan's logical mesh over global ranks in its device order (module docstring).

    Raises:
        TorchLayoutError: the process group's world size is not the plan's device count."""
    import torch.distributed as dist

    n = len(plan.device_order)
    if dist.is_initialized() and dist.get_world_size() != n:
        raise TorchLayoutError(f"the plan needs {n} ranks, the process group has "
                               f"{dist.get_world_size()}: start {n} processes")
    shape = tuple(plan.mesh.values())
    return DeviceMesh(device_type, torch.tensor(plan.device_order).view(shape),
                      mesh_dim_names=tuple(plan.mesh))


def flat_inputs(ep, user_inputs: Sequence[Any]) -> list:
    """The program's flattened inputs: its parameters, buffers and constants (from the captured
    program's state), then ``user_inputs`` (the tensors of ``example_inputs`` and of its
    keyword arguments, in order; a non-tensor argument, e.g. ``return_dict=False``, keeps the
    value it was captured with).

    Raises:
        TorchLayoutError: the number of user inputs is not the program's."""
    out, users = [], [u for u in torch.utils._pytree.tree_leaves(list(user_inputs))
                      if isinstance(u, torch.Tensor)]
    k = 0
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        kind = spec.kind.name
        traced = by_name[spec.arg.name].meta.get("val")
        if kind in ("PARAMETER", "BUFFER") and spec.target in ep.state_dict:
            out.append(ep.state_dict[spec.target])
        elif kind in ("BUFFER", "CONSTANT_TENSOR"):
            out.append(ep.constants[spec.target])
        elif not isinstance(traced, torch.Tensor):   # a non-tensor input the graph fixed
            out.append(traced)
        else:
            if k >= len(users):
                raise TorchLayoutError(f"the program takes more inputs than the {len(users)} "
                                       "tensors given")
            out.append(users[k])
            k += 1
    if k != len(users):
        raise TorchLayoutError(f"{len(users)} input tensors given, the program takes {k}")
    return out


class PlannedProgram:
    """The captured program ``ep`` laid out by ``plan`` on ``mesh`` (default ``plan_mesh``):
    call it with the user inputs; returns the full outputs. ``fallbacks``: the ops DTensor
    had no rule for (run on gathered tensors), after a call.

    Raises:
        TorchLayoutError: the plan was made for another program."""

    def __init__(self, plan, ep, mesh: DeviceMesh | None = None, device_type: str = "cpu"):
        if plan.key.fingerprint != graph_digest(ep) or \
                tuple(plan.key.input_shapes) != input_shapes(ep):
            raise TorchLayoutError(f"this plan was made for another program (fingerprint "
                                   f"{plan.key.fingerprint[:12]} != {graph_digest(ep)[:12]}); "
                                   "plan this program instead")
        self.plan, self.ep = plan, ep
        self.mesh = mesh if mesh is not None else plan_mesh(plan, device_type)
        self.device = device_type
        self.fallbacks: list[str] = []

    def __call__(self, *user_inputs) -> list[torch.Tensor]:
        runner = LayoutRunner(self.ep, self.plan.layout, self.mesh, device=self.device)
        outs = runner.run(*flat_inputs(self.ep, user_inputs))
        self.fallbacks = list(runner.fallbacks)
        return [o.full_tensor() if hasattr(o, "full_tensor") else o for o in outs]
