"""Built-in models: Wan 2.1, HunyuanVideo and Open-Sora STDiT at their real sizes, workloads, expert configurations."""
