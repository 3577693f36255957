"""Model configurations the PyTorch tests share: diffusers' Wan transformer at tiny widths
(2 layers, 4 heads of 16), small enough to capture, plan and run on the CPU in seconds."""

TINY_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16,
                in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=128,
                num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                rope_max_seq_len=64)
