"""One rank of the torch numerics test (``tests/test_torch_numerics.py``): runs a planned,
sharded program under gloo and saves its output. Not a test module (no ``test_`` prefix)."""

from __future__ import annotations

import os
import sys


def main(rank: int, world: int, port: int, workdir: str) -> None:
    import torch
    import torch.distributed as dist

    from aoizora.plans import load_plan
    from aoizora.runtime.torch import PlannedProgram

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ep = torch.export.load(os.path.join(workdir, "program.pt2"))
        inputs = torch.load(os.path.join(workdir, "inputs.pt"))
        for name in sorted(f for f in os.listdir(workdir) if f.startswith("plan_")):
            program = PlannedProgram(load_plan(os.path.join(workdir, name)), ep)
            (out,) = program(*inputs)
            if rank == 0:
                torch.save({"out": out, "fallbacks": program.fallbacks},
                           os.path.join(workdir, f"out_{name}.pt"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
