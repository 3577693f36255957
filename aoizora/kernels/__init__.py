"""aoizora.kernels: the attention primitive the models write, its splash kernel wrappers (forward
and backward), and the tile, block and libtpu-option choosers. Used by the runtime and the models."""
