"""Test set-up: 8 CPU devices for running plans for real, libtpu quiet for ahead-of-time compiles."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import aoizora  # noqa: E402,F401  (sets libtpu's environment)
