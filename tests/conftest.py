"""Test set-up: 8 CPU devices for running plans for real, libtpu quiet for ahead-of-time compiles."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import aoizora  # noqa: E402,F401  (sets libtpu's environment)


# -- the 2-layer MLP shared by the sharding ILP and sharding heuristic tests -------------------
# bf16 [B, D] x [D, F] x [F, D]: 2 x 128 MB of weights, so memory pressure decides the layout.
import pytest  # noqa: E402
import jax.numpy as jnp  # noqa: E402

MLP_B, MLP_D, MLP_F = 1024, 4096, 16384


def mlp(params, x):
    h = jax.nn.gelu(x @ params["w1"])
    return h @ params["w2"]


@pytest.fixture(scope="module")
def mlp_ir():
    from aoizora.extract.frontends.jax.ir_builder import build_ir

    bf = jnp.bfloat16
    p = {"w1": jax.ShapeDtypeStruct((MLP_D, MLP_F), bf),
         "w2": jax.ShapeDtypeStruct((MLP_F, MLP_D), bf)}
    return build_ir(mlp, p, jax.ShapeDtypeStruct((MLP_B, MLP_D), bf))


@pytest.fixture(scope="module")
def v5e4():
    from aoizora.extract.targets import get_target

    return get_target("v5e-4")
