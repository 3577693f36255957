"""Model configurations the PyTorch tests share: diffusers' Wan transformer at tiny widths
(2 layers, 4 heads of 16), small enough to capture, plan and run on the CPU in seconds."""

TINY_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16,
                in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=128,
                num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                rope_max_seq_len=64)


def tiny_wan_program():
    """(program, its partitioner IR): the tiny Wan transformer built on the meta device and
    captured with ``torch.export`` (batch 2: the CFG pair). Needs torch and diffusers."""
    import diffusers
    import torch

    from aoizora.extract.frontends.torch.aten_ir import build_torch_ir
    from aoizora.extract.frontends.torch.capture import capture

    with torch.device("meta"):
        model = diffusers.WanTransformer3DModel(**TINY_WAN)
        inputs = (torch.randn(2, 4, 4, 8, 8), torch.randn(2).abs(), torch.randn(2, 16, 32))
    ep = capture(model, inputs, {"return_dict": False})
    return ep, build_torch_ir(ep)
