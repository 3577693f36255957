"""The attention backward from the forward's residuals (``kernels.attention_backward``): splash's
dq and dk/dv kernels (Pallas interpret mode on CPU) and the reference formula, sharded on 8 CPU
devices, against ``jax.vjp`` of the dense reference attention (the yardstick shares neither the
kernels nor the formula: autodiff of softmax(q k^T) v)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora.formulation.layout import AttentionLayout
from aoizora.kernels.attention_backward import sharded_attention_bwd
from aoizora.kernels.attention_kernels import sharded_attention
from aoizora.models.experts import default_mesh
from aoizora.kernels.primitives import reference_attention

SCALE = 0.2


def _inputs(mask: bool):
    ks = jax.random.split(jax.random.PRNGKey(3), 5)
    q = jax.random.normal(ks[0], (2, 4, 100, 32))
    k, v = (jax.random.normal(kk, (2, 4, 60, 32)) for kk in ks[1:3])
    do = jax.random.normal(ks[3], (2, 4, 100, 32))
    kv_mask = (jnp.arange(60)[None, :] < jnp.array([[45], [60]])) if mask else None
    return q, k, v, do, kv_mask


@pytest.mark.parametrize("impl", ["splash", "reference"])
@pytest.mark.parametrize("al,mask", [(AttentionLayout(seq=("x", "y")), True),
                                     (AttentionLayout(batch=("x",), heads=("y",)), False),
                                     (AttentionLayout(batch=("x",), seq=("y",), kv="ring"), True)],
                         ids=["context_masked", "batch_heads", "ring_forward_masked"])
def test_backward_from_residuals_matches_autodiff_of_the_reference(impl, al, mask):
    """100 queries / 60 keys (padded to the kernel's blocks); a ring forward's residuals feed a
    backward with the keys gathered."""
    mesh = default_mesh(jax.devices()[:8], {"x": 2, "y": 4})
    q, k, v, do, kv_mask = _inputs(mask)
    _, vjp = jax.vjp(lambda a, b, c: reference_attention(a, b, c, scale=SCALE, kv_mask=kv_mask),
                     q, k, v)
    want = vjp(do)
    interp = impl == "splash"

    def run(q, k, v, do):
        out, lse = sharded_attention(q, k, v, layout=al, mesh=mesh, scale=SCALE, impl=impl,
                                     interpret=interp, kv_mask=kv_mask, residuals=True)
        return sharded_attention_bwd((q, k, v, out, lse), do, layout=al, mesh=mesh, scale=SCALE,
                                     impl=impl, interpret=interp, kv_mask=kv_mask)

    got = jax.jit(run)(q, k, v, do)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        err = float(jnp.max(jnp.abs(g - w)))
        assert err < 1e-4 * float(jnp.max(jnp.abs(w))) + 1e-5, f"{impl} {name}: max abs error {err:.3g}"
    if mask:       # a masked key gets no gradient
        masked = np.broadcast_to(~np.asarray(kv_mask)[:, None, :, None], k.shape)
        assert np.all(np.asarray(got[1])[masked] == 0) and np.all(np.asarray(got[2])[masked] == 0)


def test_forward_residuals_are_the_reference_log_sum_exp():
    mesh = default_mesh(jax.devices()[:8], {"x": 2, "y": 4})
    q, k, v, _, kv_mask = _inputs(True)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * SCALE
    want = jax.nn.logsumexp(jnp.where(kv_mask[:, None, None, :], s, -jnp.inf), axis=-1)
    for al in (AttentionLayout(seq=("x", "y")), AttentionLayout(batch=("x",), seq=("y",), kv="ring")):
        out, lse = jax.jit(lambda q, k, v: sharded_attention(
            q, k, v, layout=al, mesh=mesh, scale=SCALE, impl="splash", interpret=True,
            kv_mask=kv_mask, residuals=True))(q, k, v)
        assert lse.shape == (2, 4, 100) and lse.dtype == jnp.float32
        np.testing.assert_allclose(lse, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out, reference_attention(q, k, v, scale=SCALE, kv_mask=kv_mask),
                                   rtol=1e-4, atol=1e-5)
