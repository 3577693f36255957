"""The real XLA:TPU compiler runs ahead of time on this CPU-only machine."""

import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.tpu_compiler


def test_sharded_matmul_compiles_for_v5e_2x4_with_a_collective():
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from aoizora.extract.targets import get_target

    devs = get_target("v5e:2x4").devices()
    mesh = Mesh(np.array(devs).reshape(2, 4), ("x", "y"))
    a = jax.ShapeDtypeStruct((1024, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P("x", "y")))
    b = jax.ShapeDtypeStruct((2048, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P("y", None)))
    hlo = jax.jit(lambda a, b: a @ b).lower(a, b).compile().as_text()
    assert "all-reduce" in hlo or "reduce-scatter" in hlo
    assert "TPU" in str(devs[0].device_kind)


def test_libtpu_warnings_do_not_reach_the_user():
    code = ("import aoizora; from aoizora.extract.targets import get_target; "
            "print(len(get_target('v5e-8').devices()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "8", r.stderr
    assert "TPU_ACCELERATOR_TYPE" not in r.stderr and "TPU_WORKER_HOSTNAMES" not in r.stderr
