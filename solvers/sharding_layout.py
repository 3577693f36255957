"""A sharding ILP's choice as a Layout and in words.

A choice gives every strategy group of the StrategyGraph one strategy (group id -> index). The
tensors a group lays out take the PartitionSpec entries of its strategy (``tensor_spec``; a
tensor no group lays out is replicated); ``to_layout`` collects the input leaves, outputs,
dot/conv/attention outputs, the operands a dot reshards (pinned to what the dot requires), hints
and each attention's (batch, heads, sequence, kv mode);
``layout_words`` says the choice of every dot, conv, attention and input in words.
"""

from __future__ import annotations

from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.formulation.strategies import SWITCH_EDGE, StrategyGraph, spec_str



def _axes_entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def _layout_spec(spec) -> tuple:
    return tuple(_axes_entry(a) for a in spec)


def tensor_spec(ir, graph: StrategyGraph, choice: dict[str, int], tid: str) -> tuple:
    """The PartitionSpec entries of tensor ``tid`` under a choice (replicated where no group lays
    it out); only the choice of the group that lays it out is read."""
    o = graph.origin.get(tid)
    if o is None:
        return tuple(None for _ in ir.tensors[tid].shape)
    gid, base, tr = o
    sp = graph.groups[gid].strategies[choice[gid]].specs[base]
    for x in tr:
        sp = sp[1:] if x == "drop0" else ((),) + sp
    return _layout_spec(sp)


def to_layout(ir, graph: StrategyGraph, choice: dict[str, int], name: str = "ilp") -> Layout:
    """The Layout of a choice: input leaves, outputs, dot/conv/attention outputs, and the
    operands a dot reshards on its edge (``operand_pins``). No rules: the
    program's ``hint`` annotations constrain nothing in an ILP layout (they only name dims).
    An attention backward gets an attention layout (its keys/values gathered) and no node spec:
    its ``shard_map`` lays out dq, dk and dv itself. A state output (``ir.state_aliases``) gets
    its input's spec (the ILP priced that reshard on the state edge)."""

    def spec(tid):
        return tensor_spec(ir, graph, choice, tid)

    node_specs, attention = {}, {}
    for n in ir.nodes:
        if n.kind in ("dot", "conv", "attention") and n.results:
            node_specs[n.key] = spec(n.results[0])
        if n.kind in ("attention", "attention_bwd"):
            st = graph.groups[n.key].strategies[choice[n.key]]
            attention[n.key] = AttentionLayout(batch=st.labels.get("b", ()), heads=st.labels.get("h", ()),
                                               seq=st.labels.get("s", ()), kv=st.kv)
            if st.tiles:   # the tiles Q1 priced it with: the candidate runs what was compared
                attention[n.key] = attention[n.key].with_tiles(**st.tiles)
    for key, sp in operand_pins(ir, graph, choice).items():
        node_specs.setdefault(key, sp)
    reshard_from = switch_reshards(ir, graph, choice)
    for key, (_, to) in reshard_from.items():
        node_specs[key] = _layout_spec(to)
    out_specs = [spec(t) for t in ir.outputs]
    for o, i in getattr(ir, "state_aliases", ()):   # new state in its input's layout
        out_specs[o] = spec(ir.inputs[i])
    return Layout(mesh_axes=dict(graph.mesh_axes), in_specs=[spec(t) for t in ir.inputs],
                  out_specs=out_specs, node_specs=node_specs,
                  attention=attention, name=name,
                  reshard_from={k: _layout_spec(frm) for k, (frm, _) in reshard_from.items()})


def operand_pins(ir, graph: StrategyGraph, choice: dict[str, int]) -> dict[str, tuple]:
    """Producer node key -> spec, for each dot or conv operand the ILP reshards on its edge: the
    operand comes from another group in another spec than the one the dot's strategy requires
    (``Strategy.req``), and the dot is its only reader. Pinning the producer's output to the
    required spec makes the partitioner reshard there, as the ILP priced it (an all-to-all from
    heads to sequence, say), rather than choose its own way around the mismatch (an all-reduce
    of partial sums over a contracting dim it found split, 8x the bytes on a Ulysses output)."""
    readers = ir.consumers()
    pins: dict[str, tuple] = {}
    for n in ir.nodes:
        if n.kind not in ("dot", "conv") or n.key not in graph.group_of_node:
            continue
        gid = graph.group_of_node[n.key]
        st = graph.groups[gid].strategies[choice[gid]]
        for (key, k), need in st.req.items():
            if key != n.key or k >= len(n.operands):
                continue
            tid = n.operands[k]
            t = ir.tensors[tid]
            if t.kind != "node" or t.producer is None or readers.get(tid, []) != [n.key]:
                continue
            want = _layout_spec(need)
            if tensor_spec(ir, graph, choice, tid) != want:
                pins[t.producer] = want
    return pins


def switch_reshards(ir, graph: StrategyGraph, choice: dict[str, int]) -> dict[str, tuple]:
    """Join node key -> (spec it computes in, spec its switch point gives its output; the
    strategies' specs), for each
    switch point (``formulation.strategies``) whose two specs differ: the layout constrains the
    join's output to the first, then the second, so the reshard is on that tensor."""
    out = {}
    for e in graph.edges:
        G = graph.groups[e.consumer]
        if G.kind != "switch" or e.operand != SWITCH_EDGE:
            continue
        frm = e.p_specs[e.p_of[choice[e.producer]]]
        to = e.q_specs[e.q_of[choice[e.consumer]]]
        if frm != to:
            out[ir.tensors[G.anchor].producer] = (frm, to)
    return out


def _weight_path(ir, nodes, tid: str, depth: int = 4) -> str:
    """The input path a tensor comes from (through scan slices and converts), or ""."""
    t = ir.tensors[tid]
    for _ in range(depth):
        if t.kind == "input":
            return t.path
        if t.kind in ("scan_xs", "scan_const") and t.outer:
            t = ir.tensors[t.outer]
            continue
        if t.kind == "node":
            n = nodes[t.producer]
            ops = [o for o in n.operands if ir.tensors[o].kind != "literal"]
            if n.kind in ("elementwise", "reshape", "transpose") and len(ops) == 1:
                t = ir.tensors[ops[0]]
                continue
        return ""
    return ""


def layout_words(ir, graph: StrategyGraph, choice: dict[str, int]) -> list[str]:
    out = []
    nodes = {n.key: n for n in ir.nodes}
    anchors = ("attention", "attention_bwd", "dot", "conv")
    switches = switch_reshards(ir, graph, choice)
    for gid in sorted(graph.order(), key=lambda g: graph.groups[g].kind not in anchors):
        G = graph.groups[gid]
        st = G.strategies[choice[gid]]
        if G.kind in anchors:
            n = nodes[G.anchor]
            w = next((p for p in (_weight_path(ir, nodes, o) for o in n.operands[1:2]) if p), "")
            text = st.words if not w else st.words.replace("dot:", f"dot {w}:", 1)
            guessed = n.params.get("guesses") if n.kind == "attention" else None
            out.append(f"{text} [{gid}{' ' + n.source if n.source else ''}]"
                       + (f" (dims guessed: {'; '.join(guessed)})" if guessed else ""))
        elif G.kind == "switch" and ir.tensors[G.anchor].producer in switches:
            n = nodes[ir.tensors[G.anchor].producer]
            frm, to = switches[n.key]
            out.append(f"reshard {spec_str(frm)} -> {spec_str(to)} after "
                       f"[{n.key}{' ' + n.source if n.source else ''}]")
        elif G.kind == "input":
            t = ir.tensors[G.anchor]
            out.append(f"input {t.path or G.anchor} {list(t.shape)}: {spec_str(st.specs[G.anchor])}")
    return out
