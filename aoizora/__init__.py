"""AoiZora: solver-optimal sharding and placement plans for video diffusion transformers on TPU
slices, priced on the program the real XLA:TPU compiler emits (ahead of time, no TPU needed)."""

__version__ = "0.1.0"
