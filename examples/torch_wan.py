"""Plan diffusers' Wan 2.1 transformer for a GPU box, on a CPU machine, with no weights.

    pip install -e ".[torch]"
    python examples/torch_wan.py                  # Wan 2.1 1.3B, 480p, 81 frames, on l40-8
    python examples/torch_wan.py --target h100-8  # any target of `aoizora targets`
    python examples/torch_wan.py --small          # 2 blocks, tiny dims: a few seconds

The model is built on the meta device (``with torch.device("meta")``): torch.export captures it
without allocating a byte. ``aoizora.plan_torch`` solves the sharding ILP, collects what the
sharded DTensor program issues under a fake process group, places it with CP-SAT and prices it
with Q2; xDiT's USP configurations are priced beside the ILP's layouts as seeds. Every latency
printed is a prediction (Q2 on DTensor evidence); nothing runs on a GPU.
"""

from __future__ import annotations

import argparse
import functools

import torch
from diffusers import WanTransformer3DModel

import aoizora
from aoizora.models.xdit import XDiTConfig, xdit_layout

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json
WAN_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                rope_max_seq_len=1024)
SMALL = dict(WAN_1_3B, num_attention_heads=4, attention_head_dim=16, in_channels=4,
             out_channels=4, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=2)


def wan_on_meta(small: bool = False):
    """The transformer and one denoising step's inputs (480p, 81 frames -> latents 21 x 60 x
    104; umT5 text of 512 tokens), on the meta device, bf16."""
    with torch.device("meta"):
        model = WanTransformer3DModel(**(SMALL if small else WAN_1_3B)).to(torch.bfloat16)
        latents = torch.randn((1, 4, 4, 8, 8) if small else (1, 16, 21, 60, 104),
                              dtype=torch.bfloat16)
        text = torch.randn((1, 16, 32) if small else (1, 512, 4096), dtype=torch.bfloat16)
        inputs = (latents, torch.tensor([500]), text)
    return model, inputs


def default_target() -> str:
    """l40-8 (8 x L40 on PCIe, two sockets) where the GPU targets are installed, else v5e-8."""
    from aoizora.extract.targets import get_target

    try:
        get_target("l40-8")
        return "l40-8"
    except Exception:  # noqa: BLE001 -- a tree without the GPU targets
        return "v5e-8"


def main(target: str | None = None, small: bool = False, budget_s: float = 300.0):
    target = target or default_target()
    model, inputs = wan_on_meta(small)
    seeds = [functools.partial(xdit_layout, config=XDiTConfig(ulysses=u, ring=r))
             for u, r in ((4, 2), (2, 4))]
    plan = aoizora.plan_torch(model, inputs, target, kwargs={"return_dict": False},
                              time_budget_s=budget_s, seed_layouts=seeds)
    p = plan.predicted
    print(f"mesh {plan.mesh}, device order {plan.device_order}")
    print(f"predicted step {p['step_s'] * 1e3:.2f} ms ({p['model']}; {p['evidence']})")
    print(f"certificates: sharding {plan.certificates['sharding'].status}, "
          f"placement {plan.certificates['placement'].status}")
    return plan


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="default: l40-8 if installed, else v5e-8")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--budget", type=float, default=300.0)
    a = ap.parse_args()
    main(a.target, a.small, a.budget)
