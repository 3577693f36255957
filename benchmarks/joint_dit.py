"""A small joint text+video DiT as a user outside the built-in models would write it: text and
video tokens concatenated along the sequence for self-attention and sliced apart around the MLP and
modulation, scanned layers, CFG-sized batch. `hints=False` gives the same program without
``hint`` annotations."""
import jax, jax.numpy as jnp
from aoizora.kernels.primitives import attention, hint

def make(L=2, D=512, H=4, F=1024, S=2048, T=256, B=2, hints=True):
    bf = jnp.bfloat16
    h_ = (lambda x, *n: hint(x, *n)) if hints else (lambda x, *n: x)
    def block(x, c, p):
        # x: [B, S+T, D] joint stream; modulation from c
        mod = (c @ p["ada"]).reshape(B, 1, 6, D)
        y = x * (1 + mod[:, :, 0]) + mod[:, :, 1]
        q = (y @ p["wq"]).reshape(B, -1, H, D // H).transpose(0, 2, 1, 3)
        k = (y @ p["wk"]).reshape(B, -1, H, D // H).transpose(0, 2, 1, 3)
        v = (y @ p["wv"]).reshape(B, -1, H, D // H).transpose(0, 2, 1, 3)
        o = attention(q, k, v).transpose(0, 2, 1, 3).reshape(B, -1, D)
        x = x + (o @ p["wo"]) * mod[:, :, 2]
        x = h_(x, "batch", "seq", "embed")
        vid, txt = x[:, :S], x[:, S:]
        vid = h_(vid, "batch", "seq", "embed")
        y = vid * (1 + mod[:, :, 3]) + mod[:, :, 4]
        hmid = h_(jax.nn.gelu(y @ p["w1"]), "batch", "seq", "mlp")
        vid = vid + (hmid @ p["w2"]) * mod[:, :, 5]
        return h_(jnp.concatenate([vid, txt], axis=1), "batch", "seq", "embed")
    def fn(params, x, text, t):
        c = jax.nn.silu(t @ params["t_emb"])
        x = h_(x @ params["x_in"], "batch", "seq", "embed")
        txt = h_(text @ params["txt_in"], "batch", "seq", "embed")
        z = h_(jnp.concatenate([x, txt], axis=1), "batch", "seq", "embed")
        def body(z, p):
            return block(z, c, p), None
        z, _ = jax.lax.scan(body, z, params["blocks"])
        return z[:, :S] @ params["x_out"]
    sd = jax.ShapeDtypeStruct
    blocks = {k: sd((L,) + s, bf) for k, s in dict(ada=(D, 6 * D), wq=(D, D), wk=(D, D), wv=(D, D), wo=(D, D), w1=(D, F), w2=(F, D)).items()}
    params = dict(t_emb=sd((256, D), bf), x_in=sd((64, D), bf), txt_in=sd((128, D), bf), x_out=sd((D, 64), bf), blocks=blocks)
    args = (params, sd((B, S, 64), bf), sd((B, T, 128), bf), sd((B, 256), bf))
    return fn, args
