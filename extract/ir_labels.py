"""Dimension labels of one IR node by its kind: the einsum-style labels and roles every frontend
writes on ``extract.program_ir.Node`` (the conventions are ``program_ir``'s docstring). Each
labeler takes (node, params, operand shapes, result shapes) and returns (operand labels, result
labels, roles); the params are the frontend-neutral ones the labeler names
(``dimension_numbers`` of a dot, ``axes`` of a reduce, ``broadcast_dimensions``,
``permutation``, ``axis`` / ``dimension`` of a slice or concat, ``dimensions`` of a squeeze);
a reshape's labeler also fills ``node.groups``. The JAX frontend (``frontends.jax.ir_builder``)
and the torch frontend (``frontends.torch.aten_ir``) share them.
"""

from __future__ import annotations

from aoizora.extract.program_ir import Node


def _reshape_groups(a: list[int], b: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """Minimal groups of consecutive dims with equal products (size-1 dims join a neighbour)."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        gi, gj = [], []
        pa = pb = 1
        if i < len(a):
            gi.append(i); pa *= a[i]; i += 1
        if j < len(b):
            gj.append(j); pb *= b[j]; j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                gi.append(i); pa *= a[i]; i += 1
            elif pb < pa and j < len(b):
                gj.append(j); pb *= b[j]; j += 1
            else:
                return None
        # absorb trailing size-1 dims into this group
        while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
            gi.append(i); i += 1
        while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            gj.append(j); j += 1
        groups.append((gi, gj))
    return groups


def _labels_dot(node: Node, p, op_shapes, res_shapes):
    """Labels of a dot node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    ls, rs = op_shapes[0], op_shapes[1]
    ol = [[""] * len(ls), [""] * len(rs)]
    out = []
    for i, (a, b) in enumerate(zip(lb, rb)):
        ol[0][a] = ol[1][b] = f"b{i}"; roles[f"b{i}"] = "batch"; out.append(f"b{i}")
    for i, (a, b) in enumerate(zip(lc, rc)):
        ol[0][a] = ol[1][b] = f"k{i}"; roles[f"k{i}"] = "contracting"
    for i in [d for d in range(len(ls)) if d not in lb and d not in lc]:
        ol[0][i] = f"m{i}"; roles[f"m{i}"] = "lhs_free"; out.append(f"m{i}")
    for i in [d for d in range(len(rs)) if d not in rb and d not in rc]:
        ol[1][i] = f"n{i}"; roles[f"n{i}"] = "rhs_free"; out.append(f"n{i}")
    rl = [out]
    return ol, rl, roles


def _labels_conv(node: Node, p, op_shapes, res_shapes):
    """Labels of a conv node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    dn = p["dimension_numbers"]
    lsp, rsp, osp = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    nsp = len(lsp) - 2
    ls, rs, os_ = op_shapes[0], op_shapes[1], res_shapes[0]
    ol = [[""] * len(ls), [""] * len(rs)]
    out = [""] * len(os_)
    ol[0][lsp[0]] = "b"; out[osp[0]] = "b"; roles["b"] = "batch"
    ol[0][lsp[1]] = "k"; ol[1][rsp[1]] = "k"; roles["k"] = "contracting"
    ol[1][rsp[0]] = "n"; out[osp[1]] = "n"; roles["n"] = "rhs_free"
    for s in range(nsp):
        ol[0][lsp[2 + s]] = f"si{s}"; roles[f"si{s}"] = "spatial"
        ol[1][rsp[2 + s]] = f"w{s}"; roles[f"w{s}"] = "spatial"
        out[osp[2 + s]] = f"so{s}"; roles[f"so{s}"] = "spatial"
    rl = [out]
    return ol, rl, roles


def _labels_attention(node: Node, p, op_shapes, res_shapes):
    """Labels of a attention node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    ol = [["b", "h", "s", "d"], ["b", "h", "t", "d"], ["b", "h", "t", "d"]]
    if len(op_shapes) == 4:             # the key mask [B, T], as a found attention's mask
        ol.append(["b", "t"])
    rl = [["b", "h", "s", "d"], ["b", "h", "s"]][:len(res_shapes)]   # out (and lse)
    roles = {"b": "batch", "h": "heads", "s": "q_seq", "t": "kv_seq", "d": "head_dim"}
    return ol, rl, roles


def _labels_attention_bwd(node: Node, p, op_shapes, res_shapes):
    """Labels of a attention_bwd node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    q, kv = ["b", "h", "s", "d"], ["b", "h", "t", "d"]
    ol = [q, kv, list(kv), list(q), ["b", "h", "s"], list(q)]      # q, k, v, out, lse, do
    rl = [list(q), list(kv), list(kv)]
    if len(op_shapes) == 7:             # the forward's key mask [B, T]
        ol.append(["b", "t"])
    roles = {"b": "batch", "h": "heads", "s": "q_seq", "t": "kv_seq", "d": "head_dim"}
    return ol, rl, roles


def _labels_elementwise(node: Node, p, op_shapes, res_shapes):
    """Labels of a elementwise node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    out = [f"e{i}" for i in range(len(res_shapes[0]))]
    for i in out:
        roles[i] = "aligned"
    r = len(out)
    for k, s in enumerate(op_shapes):
        if len(s) == 0:
            continue
        off = r - len(s)
        ol[k] = [out[off + d] if s[d] == res_shapes[0][off + d] else f"x{k}_{d}"
                 for d in range(len(s))]
        for d in range(len(s)):
            if ol[k][d].startswith("x"):
                roles[ol[k][d]] = "expanded"
    rl = [list(out) for _ in res_shapes]
    return ol, rl, roles


def _labels_reduce(node: Node, p, op_shapes, res_shapes):
    """Labels of a reduce node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    axes = tuple(p.get("axes", ()))
    s = op_shapes[0]
    ol = [[f"e{i}" for i in range(len(s))]]
    for i in range(len(s)):
        roles[f"e{i}"] = "reduced" if i in axes else "kept"
    rl = [[f"e{i}" for i in range(len(s)) if i not in axes] for _ in res_shapes]
    return ol, rl, roles


def _labels_broadcast(node: Node, p, op_shapes, res_shapes):
    """Labels of a broadcast node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    s, o = op_shapes[0], res_shapes[0]
    bd = tuple(p["broadcast_dimensions"])
    out = [f"e{j}" for j in range(len(o))]
    for j in range(len(o)):
        roles[out[j]] = "aligned" if j in bd else "new"
    ol[0] = []
    for i, j in enumerate(bd):
        if s[i] == o[j]:
            ol[0].append(out[j])
        else:
            ol[0].append(f"x{i}"); roles[f"x{i}"] = "expanded"
    for k in range(1, len(op_shapes)):
        ol[k] = [f"dyn{k}_{d}" for d in range(len(op_shapes[k]))]
    rl = [out]
    return ol, rl, roles


def _labels_transpose(node: Node, p, op_shapes, res_shapes):
    """Labels of a transpose node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    perm = tuple(p["permutation"])
    s = op_shapes[0]
    ol = [[f"e{i}" for i in range(len(s))]]
    rl = [[f"e{perm[j]}" for j in range(len(perm))]]
    for i in range(len(s)):
        roles[f"e{i}"] = "aligned" if perm[i] == i else "moved"
    return ol, rl, roles


def _labels_reshape(node: Node, p, op_shapes, res_shapes):
    """Labels of a reshape node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    s, o = op_shapes[0], res_shapes[0]
    grp = _reshape_groups(list(s), list(o))
    ol = [[f"i{i}" for i in range(len(s))]] + [[f"dyn{k}_{d}" for d in range(len(op_shapes[k]))]
                                              for k in range(1, len(op_shapes))]
    out = [f"o{j}" for j in range(len(o))]
    groups = []
    if grp is None:
        for lab in ol[0]:
            roles[lab] = "regrouped"
        for lab in out:
            roles[lab] = "regrouped"
        groups.append({"in": list(range(len(s))), "out": list(range(len(o)))})
    else:
        for gi, gj in grp:
            gi_n = [d for d in gi if s[d] != 1]
            gj_n = [d for d in gj if o[d] != 1]
            if len(gi_n) == 1 and len(gj_n) == 1:
                lab = f"i{gi_n[0]}"
                out[gj_n[0]] = lab
                roles[lab] = "aligned"
                how = "aligned"
            else:
                how = "split" if len(gi_n) <= 1 else ("merged" if len(gj_n) <= 1 else "regrouped")
                for d in gi:
                    roles.setdefault(f"i{d}", how)
                for d in gj:
                    roles.setdefault(out[d], how)
            for d in gi:
                if s[d] == 1:
                    roles.setdefault(f"i{d}", "unit")
            for d in gj:
                if o[d] == 1:
                    roles.setdefault(out[d], "unit")
            groups.append({"in": list(gi), "out": list(gj), "how": how})
    node.groups = [{"in": g["in"], "out": g["out"]} for g in groups]
    node.params.setdefault("group_kinds", [g.get("how", "regrouped") for g in groups])
    rl = [out]
    return ol, rl, roles


def _labels_stack(node: Node, p, op_shapes, res_shapes):
    """Labels of a stack node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    o = res_shapes[0]
    axis = int(p["axis"]) % len(o)
    out = [f"e{j}" for j in range(len(o))]
    for j in range(len(o)):
        roles[out[j]] = "new" if j == axis else "aligned"
    dims = [j for j in range(len(o)) if j != axis]
    ol = [[out[j] for j in dims] for _ in op_shapes]
    rl = [out]
    return ol, rl, roles


def _labels_squeeze(node: Node, p, op_shapes, res_shapes):
    """Labels of a squeeze node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    s = op_shapes[0]
    dims = tuple(d % max(len(s), 1) for d in p["dimensions"])
    ol = [[f"e{i}" for i in range(len(s))]]
    rl = [[f"e{i}" for i in range(len(s)) if i not in dims]]
    for i in range(len(s)):
        roles[f"e{i}"] = "unit" if i in dims else "aligned"
    return ol, rl, roles


def _labels_slice(node: Node, p, op_shapes, res_shapes):
    """Labels of a slice/pad/concat/cumulative/sort node: (operand labels, result labels, roles)."""
    ol: list[list[str]] = [[] for _ in op_shapes]
    rl: list[list[str]] = [[] for _ in res_shapes]
    roles: dict[str, str] = {}
    kind = node.kind
    o = res_shapes[0]
    axis = p.get("axis", p.get("dimension", None))
    out = [f"e{j}" for j in range(len(o))]
    for j in range(len(o)):
        roles[out[j]] = "aligned"
    for k, s in enumerate(op_shapes):
        if len(s) != len(o):
            ol[k] = [f"x{k}_{d}" for d in range(len(s))]
            continue
        ol[k] = [out[d] if (s[d] == o[d] and d != axis) else f"x{k}_{d}" for d in range(len(s))]
    for j in range(len(o)):
        if any(len(s) == len(o) and ol[k][j] != out[j] for k, s in enumerate(op_shapes)) \
                or j == axis:
            out[j] = f"r{j}"; roles[out[j]] = "sliced"
    for k in range(len(op_shapes)):
        for lab in ol[k]:
            roles.setdefault(lab, "sliced")
    rl = [list(out) for _ in res_shapes]
    if kind == "sort":
        rl = [list(out) for _ in res_shapes]
    return ol, rl, roles


LABELERS = {
    "dot": _labels_dot,
    "conv": _labels_conv,
    "attention": _labels_attention,
    "attention_bwd": _labels_attention_bwd,
    "elementwise": _labels_elementwise,
    "reduce": _labels_reduce,
    "broadcast": _labels_broadcast,
    "transpose": _labels_transpose,
    "reshape": _labels_reshape,
    "stack": _labels_stack,
    "squeeze": _labels_squeeze,
    "slice": _labels_slice,
    "pad": _labels_slice,
    "concat": _labels_slice,
    "cumulative": _labels_slice,
    "sort": _labels_slice,
}
