"""Built-in models: Wan 2.1 and HunyuanVideo DiTs at their real sizes, workloads, expert configurations."""
