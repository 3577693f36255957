"""Evidence from compiled programs: hand-written HLO, and the real XLA:TPU compiler ahead of time."""

import re

import numpy as np
import pytest

from aoizora.extract.compiled_evidence import (EvidenceError, evidence_from_compiled,
                                               evidence_from_hlo_text)
from aoizora.extract.evidence import Evidence
from aoizora.extract.evidence_summary import hidden_compute_cycles, summarize_evidence
from aoizora.extract.hlo import HloParseError, parse_hlo_module
from aoizora.extract.replica_groups import parse_replica_groups
from aoizora.extract.targets import get_target

# ---------------------------------------------------------------------------------------------
# Hand-written HLO: every construct the reader handles, numbers worked out by hand

HAND = """\
HloModule hand, is_scheduled=true, num_partitions=8

FileNames
1 "/src/model.py"

FunctionNames
1 "layer"

FileLocations
1 {file_name_id=1 function_name_id=1 line=42 end_line=42 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}


%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%mm (p0: bf16[64,128], p1: bf16[128,32]) -> bf16[64,32] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = bf16[128,32]{1,0} parameter(1)
  ROOT %conv = bf16[64,32]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%a2a (q: f32[8,16]) -> f32[8,16] {
  %q = f32[8,16]{1,0} parameter(0)
  ROOT %ata = f32[8,16]{1,0} all-to-all(%q), channel_id=7, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}
}

%inner_body (ib: (s32[], f32[16,16])) -> (s32[], f32[16,16]) {
  %ib = (s32[], f32[16,16]{1,0}) parameter(0)
  %ic = s32[] get-tuple-element(%ib), index=0
  %iv = f32[16,16]{1,0} get-tuple-element(%ib), index=1
  %one.i = s32[] constant(1)
  %inext = s32[] add(%ic, %one.i)
  %ar2 = f32[16,16]{1,0} all-reduce(%iv), channel_id=5, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=%add, backend_config={"collective_algorithm_config":{"emitter":"X"}}
  ROOT %it = (s32[], f32[16,16]{1,0}) tuple(%inext, %ar2)
}

%inner_cond (icp: (s32[], f32[16,16])) -> pred[] {
  %icp = (s32[], f32[16,16]{1,0}) parameter(0)
  %icc = s32[] get-tuple-element(%icp), index=0
  %three = s32[] constant(3)
  ROOT %ilt = pred[] compare(%icc, %three), direction=LT
}

%body (b: (s32[], bf16[64,128], f32[16,16])) -> (s32[], bf16[64,128], f32[16,16]) {
  %b = (s32[], bf16[64,128]{1,0}, f32[16,16]{1,0}) parameter(0)
  %c = s32[] get-tuple-element(%b), index=0
  %v = bf16[64,128]{1,0} get-tuple-element(%b), index=1
  %w = f32[16,16]{1,0} get-tuple-element(%b), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%c, %one)
  %v.sl = bf16[64,32]{1,0} slice(%v), slice={[0:64], [0:32]}
  %ags = (bf16[64,32]{1,0}, bf16[64,128]{1,0}) all-gather-start(%v.sl), channel_id=1, replica_groups=[2,4]<=[8], dimensions={1}, use_global_device_ids=true, metadata={op_name="jit(f)/while/body/dot_general" stack_frame_id=1}, backend_config={"collective_algorithm_config":{"emitter":"1DAllGatherNonMajorDim"}}
  %f1 = bf16[64,32]{1,0} fusion(%v, %v), kind=kOutput, calls=%mm, backend_config={"window_config":{"estimated_cycles":"1000"}}
  %ars = f32[16,16]{1,0} all-reduce(%w), channel_id=2, replica_groups={}, to_apply=%add
  %f2 = bf16[64,32]{1,0} fusion(%v, %v), kind=kOutput, calls=%mm, backend_config={"window_config":{"estimated_cycles":"500"}}
  %agd = bf16[64,128]{1,0} all-gather-done(%ags)
  %z = s32[] constant(0)
  %itup = (s32[], f32[16,16]{1,0}) tuple(%z, %w)
  %inner = (s32[], f32[16,16]{1,0}) while(%itup), condition=%inner_cond, body=%inner_body
  %rs = f32[4,16]{1,0} reduce-scatter(%w), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
  ROOT %t = (s32[], bf16[64,128]{1,0}, f32[16,16]{1,0}) tuple(%next, %agd, %w)
}

%cond (cp: (s32[], bf16[64,128], f32[16,16])) -> pred[] {
  %cp = (s32[], bf16[64,128]{1,0}, f32[16,16]{1,0}) parameter(0)
  %cc = s32[] get-tuple-element(%cp), index=0
  %thirty = s32[] constant(30)
  ROOT %lt = pred[] compare(%cc, %thirty), direction=LT
}

ENTRY %main (a: bf16[64,128], m: f32[16,16], q: f32[8,16]) -> bf16[64,128] {
  %a = bf16[64,128]{1,0} parameter(0)
  %m = f32[16,16]{1,0} parameter(1)
  %q = f32[8,16]{1,0} parameter(2)
  %zero = s32[] constant(0)
  %zc = s32[] copy(%zero)
  %tup = (s32[], bf16[64,128]{1,0}, f32[16,16]{1,0}) tuple(%zc, %a, %m)
  %loop = (s32[], bf16[64,128]{1,0}, f32[16,16]{1,0}) while(%tup), condition=%cond, body=%body
  %cps = (f32[8,16]{1,0}, f32[8,16]{1,0}, u32[], u32[]) collective-permute-start(%q), channel_id=4, source_target_pairs={{0,1},{1,2},{2,0}}
  %cpd = f32[8,16]{1,0} collective-permute-done(%cps)
  %as = ((f32[8,16]{1,0}), f32[8,16]{1,0}, u32[]) async-start(%cpd), calls=%a2a
  %ad = f32[8,16]{1,0} async-done(%as)
  ROOT %out = bf16[64,128]{1,0} get-tuple-element(%loop), index=1
}
"""


def _hand():
    return evidence_from_hlo_text(HAND, target="v5e:2x4", mesh_axes={"d": 2, "m": 4},
                                  device_order=list(range(8)), clock_hz=1.5e9)


def test_hand_written_collectives_counts_bytes_and_groups():
    ev = _hand()
    by = {c.name: c for c in ev.collectives}
    assert set(by) == {"ags", "ars", "ar2", "rs", "cps", "as"}
    ag = by["ags"]
    assert (ag.kind, ag.dtype, ag.bytes, ag.count) == ("all-gather", "bf16", 64 * 128 * 2, 30)
    assert ag.is_async and ag.replica_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ag.op_name == "jit(f)/while/body/dot_general" and ag.source == "/src/model.py:42"
    # all-reduce with empty groups: one group of all 8; 16x16 f32
    assert by["ars"].bytes == 1024 and by["ars"].replica_groups == [list(range(8))]
    # nested loop: 30 x 3 runs
    assert by["ar2"].count == 90 and by["ar2"].group_size == 2
    # reduce-scatter: V is the operand (16x16 f32), not the 4x16 result
    assert by["rs"].kind == "reduce-scatter" and by["rs"].bytes == 1024
    cp = by["cps"]
    assert cp.kind == "collective-permute" and cp.source_target_pairs == [(0, 1), (1, 2), (2, 0)]
    assert cp.replica_groups == [[0, 1, 2]] and cp.bytes == 512 and cp.count == 1
    a2a = by["as"]
    assert a2a.kind == "all-to-all" and a2a.is_async and a2a.bytes == 512
    assert a2a.replica_groups == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_hand_written_schedule_phases_and_overlap():
    ev = _hand()
    by = {c.name: c for c in ev.collectives}
    ag = by["ags"]
    # compute strictly between all-gather-start and -done: two fusions, 1000 + 500 cycles
    assert ag.overlap_cycles == 1500
    # the sync all-reduce inside the all-gather's window runs with it: same phase
    assert by["ars"].phase == ag.phase
    assert len({by["ar2"].phase, by["rs"].phase, ag.phase, by["cps"].phase}) == 4
    # compute hidden behind async collectives, per call: (1000 + 500) cycles x 30 runs
    assert hidden_compute_cycles(ev) == 45000
    phases = [c.phase for c in sorted(ev.collectives, key=lambda c: c.start_index)]
    assert phases == sorted(phases)
    assert ag.start_index < by["ars"].start_index < ag.done_index


def test_hand_written_compute_and_algorithms_kept_apart():
    ev = _hand()
    fus = [op for op in ev.compute if op.kind == "fusion"]
    assert sorted(op.estimated_cycles for op in fus) == [500.0, 1000.0]
    assert all(op.count == 30 for op in fus)
    assert set(ev.algorithms) == {"ags", "ar2"}
    assert ev.algorithms["ags"] == {"emitter": "1DAllGatherNonMajorDim"}
    assert "1DAllGather" not in str(ev.placement_open())


def test_hand_written_json_round_trip():
    ev = _hand()
    back = Evidence.loads(ev.dumps())
    assert back == ev
    assert back.collectives[0].source_target_pairs is None or isinstance(
        back.collectives[0].source_target_pairs[0], tuple)


def test_known_trip_count_and_unknown_trip_count():
    text = HAND.replace("condition=%cond, body=%body",
                        'condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"7"}}')
    by = {c.name: c for c in evidence_from_hlo_text(text, target="v5e:2x4",
                                                    mesh_axes={"d": 2, "m": 4}).collectives}
    assert by["ags"].count == 7 and by["ar2"].count == 21
    # a counter that starts from a parameter: unknown, counted once, and said so
    text = HAND.replace("tuple(%zc, %a, %m)", "tuple(%pc, %a, %m)").replace(
        "%zc = s32[] copy(%zero)", "%pc = s32[] parameter(3)")
    ev = evidence_from_hlo_text(text, target="v5e:2x4", mesh_axes={"d": 2, "m": 4})
    assert {c.name: c.count for c in ev.collectives}["ags"] == 1
    assert any("trip count unknown" in w for w in ev.warnings)


def test_unrolled_counter_step():
    # the body adds 1 twice per iteration (an unrolled loop): 30 / 2 = 15 trips
    text = HAND.replace("%next = s32[] add(%c, %one)",
                        "%half = s32[] add(%c, %one)\n  %next = s32[] add(%half, %one)")
    by = {c.name: c for c in evidence_from_hlo_text(text, target="v5e:2x4",
                                                    mesh_axes={"d": 2, "m": 4}).collectives}
    assert by["ags"].count == 15 and by["ar2"].count == 45
    # counting down from 30 to 0 with a GT compare: 30 trips
    text = HAND.replace("tuple(%zc, %a, %m)", "tuple(%thirty.e, %a, %m)").replace(
        "%zc = s32[] copy(%zero)", "%thirty.e = s32[] constant(30)").replace(
        "%next = s32[] add(%c, %one)", "%next = s32[] subtract(%c, %one)").replace(
        "%thirty = s32[] constant(30)", "%thirty = s32[] constant(0)").replace(
        "direction=LT\n}\n\nENTRY", "direction=GT\n}\n\nENTRY")
    by = {c.name: c for c in evidence_from_hlo_text(text, target="v5e:2x4",
                                                    mesh_axes={"d": 2, "m": 4}).collectives}
    assert by["ags"].count == 30


def test_unknown_syntax_is_a_clear_error():
    bad = HAND.replace("%m = f32[16,16]{1,0} parameter(1)", "%m = q7[16,16]{1,0} parameter(1)")
    with pytest.raises(HloParseError, match=r"line \d+.*q7"):
        parse_hlo_module(bad)
    with pytest.raises(HloParseError, match="line"):
        parse_hlo_module(HAND.replace("  %one = s32[] constant(1)\n", "  what is this\n"))
    with pytest.raises(HloParseError):
        parse_hlo_module(HAND.replace("ROOT %lt = pred[] compare(%cc, %thirty), direction=LT",
                                      "ROOT %lt = pred[] compare(%cc, %thirty, direction=LT"))
    with pytest.raises(ValueError, match="replica"):
        evidence_from_hlo_text(HAND.replace("replica_groups={}", "replica_groups=<<weird>>"),
                               target="v5e:2x4", mesh_axes={"d": 2, "m": 4})
    with pytest.raises(EvidenceError, match="send"):
        evidence_from_hlo_text(HAND.replace("%zc = s32[] copy(%zero)",
                                            "%zc = s32[] copy(%zero)\n  %snd = (f32[], u32[]) send(%zero), channel_id=9"),
                               target="v5e:2x4", mesh_axes={"d": 2, "m": 4})


def test_unreadable_backend_config_is_visible():
    text = HAND.replace('backend_config={"window_config":{"estimated_cycles":"500"}}',
                        'backend_config={window_config:oops}')
    ev = evidence_from_hlo_text(text, target="v5e:2x4", mesh_axes={"d": 2, "m": 4})
    assert any("f2" in w and "not JSON" in w for w in ev.warnings)
    assert {op.name: op.estimated_cycles for op in ev.compute}["f2"] is None


def test_mesh_size_must_match_the_module():
    with pytest.raises(EvidenceError, match="8 partitions"):
        evidence_from_hlo_text(HAND, target="v5e:2x2", mesh_axes={"d": 2, "m": 2})


# ---------------------------------------------------------------------------------------------
# The real compiler

def _mesh(order=None, axes=None, target="v5e:2x4", platform=None):
    from aoizora.extract.aot_compile import target_mesh

    return target_mesh(get_target(target), axes or {"d": 2, "m": 4}, order,
                       platform=platform)


def _sds(mesh, shape, spec, dtype="bfloat16"):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=NamedSharding(mesh, P(*spec)))


def _mlp_grad_args(mesh, L=4, D=512, F=1024, T=1024):
    w = (None, "m", None)
    return [_sds(mesh, (T, D), ("d", None)), _sds(mesh, (L, D, D), w), _sds(mesh, (L, D, D), w),
            _sds(mesh, (L, D, F), w), _sds(mesh, (L, F, D), w)]


def _mlp_grad():
    import jax

    def layer(x, w):
        wq, wo, w1, w2 = w
        x = x + jax.nn.gelu(x @ wq) @ wo
        return x + jax.nn.gelu(x @ w1) @ w2, None

    def loss(x, wq, wo, w1, w2):
        return jax.lax.scan(layer, x, (wq, wo, w1, w2))[0].sum()

    return jax.grad(loss, argnums=(1, 2, 3, 4))


@pytest.mark.tpu_compiler
def test_thirty_layer_scan_counts_each_layer_collective_thirty_times():
    import jax

    from aoizora.extract.aot_compile import compile_evidence

    def layer(x, w):
        return jax.numpy.tanh(x @ w[0]) @ w[1], None

    def model(x, ws):
        return jax.lax.scan(layer, x, ws)[0]

    mesh = _mesh()
    ev = compile_evidence(model, (_sds(mesh, (256, 512), ("d", None)),
                                  _sds(mesh, (30, 2, 512, 512), (None, None, None, "m"))),
                          mesh=mesh, target=get_target("v5e-8"))
    in_loop = [c for c in ev.collectives if "/while/body/" in c.op_name]
    assert in_loop, summarize_evidence(ev)
    assert all(c.count == 30 for c in in_loop)
    assert all(c.count == 1 for c in ev.collectives if "/while/" not in c.op_name)
    # the per-layer all-gathers of the 512-wide activations over m (groups of 4)
    assert all(c.group_size == 4 for c in in_loop)
    assert ev.fidelity == "tpu" and ev.clock_hz == 1.5e9 and ev.memory.fits


@pytest.mark.tpu_compiler
def test_nested_scans_multiply_trip_counts():
    import jax

    from aoizora.extract.aot_compile import compile_evidence

    def inner(x, w):
        return jax.numpy.tanh(x @ w), None

    def outer(x, ws):
        return jax.lax.scan(inner, x, ws)[0], None

    def model(x, ws):
        return jax.lax.scan(outer, x, ws)[0]

    mesh = _mesh()
    ev = compile_evidence(model, (_sds(mesh, (256, 256), ("d", None)),
                                  _sds(mesh, (3, 5, 256, 256), (None, None, None, "m"))),
                          mesh=mesh, target=get_target("v5e-8"))
    counts = {c.count for c in ev.collectives if "/while/body/" in c.op_name}
    assert counts == {15}, summarize_evidence(ev)


@pytest.mark.tpu_compiler
def test_async_collective_fusions_reduce_scatter_and_overlap():
    from aoizora.extract.aot_compile import compile_evidence

    mesh = _mesh()
    ev = compile_evidence(_mlp_grad(), _mlp_grad_args(mesh), mesh=mesh, target=get_target("v5e-8"))
    kinds = {c.kind for c in ev.collectives}
    assert {"all-gather", "all-reduce", "reduce-scatter"} <= kinds
    fused = [c for c in ev.collectives if c.is_async and c.fused_with]
    assert fused, summarize_evidence(ev)
    for c in fused:
        assert c.start_index < c.done_index and c.overlap_cycles > 0 and c.count == 4
    assert all(op.estimated_cycles is not None for op in ev.compute if op.kind == "fusion")
    # every algorithm choice belongs to a collective of the evidence, and to nothing else
    names = {c.name for c in ev.collectives}
    assert set(ev.algorithms) <= names
    assert "collective_algorithm_config" not in ev.dumps().split('"algorithms"')[0]
    assert "emitter" not in str(ev.placement_open())
    s = summarize_evidence(ev)
    assert "reduce-scatter" in s and "fits" in s and "cycles" in s


@pytest.mark.tpu_compiler
def test_two_device_orders_same_placement_open_evidence():
    import jax.numpy as jnp

    from aoizora.extract.aot_compile import compile_evidence

    def f(a, b):
        return jnp.tanh(a @ b) @ b.T

    orders = [list(range(8)), [7, 2, 5, 0, 3, 6, 1, 4]]
    evs = []
    for order in orders:
        mesh = _mesh(order)
        evs.append(compile_evidence(f, (_sds(mesh, (1024, 2048), ("d", "m")),
                                        _sds(mesh, (2048, 512), ("m", None))),
                                    mesh=mesh, target=get_target("v5e:2x4")))
    assert evs[0].placement_open() == evs[1].placement_open()
    assert [e.algorithms_device_order for e in evs] == orders
    assert set(evs[0].algorithms) == set(evs[1].algorithms) and evs[0].algorithms
    # observed with libtpu 0.0.42.1: the ring all-reduce needs a reordering map on one order only
    assert evs[0].algorithms != evs[1].algorithms


@pytest.mark.tpu_compiler
def test_two_device_orders_scanned_gradient():
    from aoizora.extract.aot_compile import compile_evidence

    evs = []
    for order in (None, [3, 1, 0, 2, 7, 5, 6, 4]):
        mesh = _mesh(order)
        evs.append(compile_evidence(_mlp_grad(), _mlp_grad_args(mesh, L=2, D=256, F=512, T=512),
                                    mesh=mesh, target=get_target("v5e-8")))
    assert evs[0].placement_open() == evs[1].placement_open()
    assert evs[0].algorithms_device_order != evs[1].algorithms_device_order


@pytest.mark.tpu_compiler
def test_real_evidence_json_round_trip():
    import jax.numpy as jnp

    from aoizora.extract.aot_compile import compile_evidence

    mesh = _mesh(axes={"x": 8})
    ev = compile_evidence(lambda x: jnp.roll(x, 1, axis=0) * 2, (_sds(mesh, (256, 128), ("x", None)),),
                          mesh=mesh, target=get_target("v5e-8"))
    assert any(c.kind == "collective-permute" for c in ev.collectives)
    assert Evidence.loads(ev.dumps()) == ev
    assert Evidence.loads(ev.dumps()).placement_open() == ev.placement_open()


@pytest.mark.tpu_compiler
def test_out_of_memory_is_recorded_not_raised():
    from aoizora.extract.aot_compile import compile_evidence

    mesh = _mesh()
    big = _sds(mesh, (65536, 65536), (), "float32")  # 16 GiB replicated, doubled by the output
    ev = compile_evidence(lambda a: a * 2 + 1, (big,), mesh=mesh, target=get_target("v5e-8"))
    assert ev.memory.fits is False
    assert "RESOURCE_EXHAUSTED" in ev.memory.oom_message and "HBM" in ev.memory.oom_message
    assert ev.compile_s > 0 and not ev.collectives
    assert "DOES NOT FIT" in summarize_evidence(ev)
    assert Evidence.loads(ev.dumps()) == ev


@pytest.mark.tpu_compiler
def test_trace_failure_is_a_compile_error():
    from aoizora.extract.aot_compile import CompileError, compile_evidence

    mesh = _mesh()

    def broken(a):
        return a @ a  # (64, 128) @ (64, 128): shapes do not contract

    with pytest.raises(CompileError, match="cannot trace"):
        compile_evidence(broken, (_sds(mesh, (64, 128), ("d", None)),), mesh=mesh, target=get_target("v5e-8"))


def test_cpu_fallback_is_low_fidelity():
    from aoizora.extract.aot_compile import compile_evidence

    mesh = _mesh(platform="cpu")
    assert next(iter(mesh.devices.flat)).platform == "cpu"
    ev = compile_evidence(lambda a, b: a @ b, (_sds(mesh, (256, 512), ("d", "m"), "float32"),
                                               _sds(mesh, (512, 128), ("m", None), "float32")),
                          mesh=mesh, target=get_target("v5e-8"))
    assert ev.fidelity == "cpu-low" and any("low fidelity" in w for w in ev.warnings)
    ar = [c for c in ev.collectives if c.kind == "all-reduce"]
    assert ar and ar[0].replica_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ar[0].bytes == 128 * 128 * 4
    assert all(op.estimated_cycles is None for op in ev.compute)


# ---------------------------------------------------------------------------------------------
# Property: random shardings of random small programs compile and parse; bytes agree with an
# independent count read straight from the HLO text with regular expressions.

_ELEM = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
         "s64": 8, "u64": 8, "f64": 8}
_COLL = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) (all-gather|all-reduce|reduce-scatter|all-to-all|"
                   r"collective-permute)(-start)?\((.*?)\)")
_DEF = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\(.*?\)|[a-z0-9]+\[[0-9,]*\])")


def _arrays_bytes(shape_text):
    return [int(np.prod([int(d) for d in dims.split(",") if d] or [1])) * _ELEM[t]
            for t, dims in re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", shape_text)]


def _independent_collective_bytes(text, n):
    """channel -> (kind, V) straight from the text: V = max(operand, result) bytes."""
    sizes = {}
    for line in text.splitlines():
        m = _DEF.match(line)
        if m:
            sizes[m.group(1)] = max(_arrays_bytes(m.group(2)) or [0])
    out = {}
    for line in text.splitlines():
        m = _COLL.match(line)
        if not m:
            continue
        name, shape, kind, start, operands = m.groups()
        ch = re.search(r"channel_id=(\d+)", line)
        key = ch.group(1) if ch else name
        if key in out:
            continue
        # a -start returns (operands, results, context): its larger array is V; a sync
        # collective with several buffers (variadic all-reduce) moves all of them
        res = max(_arrays_bytes(shape)) if start else sum(_arrays_bytes(shape))
        ops = [sizes[o] for o in re.findall(r"%([^\s,]+)", operands)]
        v = max(res, sum(ops))
        rg = re.search(r"replica_groups=(\{\{.*?\}\}|\{\}|\[[^ ]*?(?=, )|mesh\[.*?\}(?=,))", line)
        gs = max(len(g) for g in parse_replica_groups(rg.group(1), n)) if rg else None
        if kind == "all-gather":  # shape arithmetic: the result is group-size operands
            assert res == gs * sum(ops), line[:200]
        out[key] = (kind, v)
    return out


@pytest.mark.tpu_compiler
def test_property_random_shardings_bytes_agree():
    import jax
    import jax.numpy as jnp
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    mesh = _mesh()
    axis_choices = [None, "d", "m", ("d", "m"), ("m", "d")]

    def spec_ok(spec):
        used = [a for s in spec if s for a in (s if isinstance(s, tuple) else (s,))]
        return len(used) == len(set(used))

    seen_kinds = set()
    spec2 = st.tuples(st.sampled_from(axis_choices), st.sampled_from(axis_choices)).filter(spec_ok)

    @settings(max_examples=15, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(dims=st.lists(st.sampled_from([128, 256, 512]), min_size=2, max_size=3),
           batch=st.sampled_from([128, 256]), specs=st.lists(spec2, min_size=4, max_size=4),
           dtype=st.sampled_from(["bfloat16", "float32"]), grad=st.booleans())
    def check(dims, batch, specs, dtype, grad):
        n_w = len(dims) - 1
        args = [_sds(mesh, (batch, dims[0]), specs[0], dtype)]
        args += [_sds(mesh, (dims[i], dims[i + 1]), specs[1 + i % 3], dtype) for i in range(n_w)]

        def chain(x, *ws):
            for w in ws:
                x = jnp.tanh(x @ w)
            return x.sum() if grad else x

        fn = jax.grad(chain, argnums=tuple(range(1, n_w + 1))) if grad else chain
        with jax.set_mesh(mesh):
            compiled = jax.jit(fn).lower(*args).compile()
        ev = evidence_from_compiled(compiled, target=get_target("v5e:2x4"), mesh=mesh)
        ind = _independent_collective_bytes(compiled.as_text(), 8)
        assert len(ev.collectives) == len(ind)
        assert sorted(c.bytes for c in ev.collectives) == sorted(v for _, v in ind.values())
        for c in ev.collectives:
            assert c.count == 1 and c.bytes > 0
            assert sorted(i for g in c.replica_groups for i in g) == (
                list(range(8)) if c.kind != "collective-permute" else c.replica_groups[0])
        assert Evidence.loads(ev.dumps()) == ev
        seen_kinds.update(c.kind for c in ev.collectives)

    check()
    assert len(seen_kinds) >= 2, seen_kinds  # the examples did exercise collectives


@pytest.mark.tpu_compiler
def test_small_wan_model_two_device_orders():
    """A real DiT (the small Wan config, splash attention, FSDP + context parallel) compiled under
    two device orders: identical placement-open evidence; only algorithm choices move."""
    import jax
    from jax.sharding import AxisType, Mesh

    from aoizora.extract.targets import get_target
    from aoizora.formulation.layout import AttentionLayout, Layout
    from aoizora.models.registry import abstract_inputs, denoise_step, get_model
    from aoizora.runtime.realize import realize

    m = get_model("wan2.1-small")
    wl = m.workload("tiny-9f")
    tgt = get_target("v5e-8")
    devs = {d.id: d for d in tgt.devices()}
    args = abstract_inputs(m, wl)
    n_in = len(jax.tree_util.tree_leaves(args))
    layout = Layout(mesh_axes={"data": 2, "seq": 4}, in_specs=[None] * n_in, out_specs=None,
                    rules={"batch": ("data",), "seq": ("seq",)},
                    attention={"*": AttentionLayout(batch=("data",), seq=("seq",), kv="gather")},
                    name="cp")
    evs = []
    for order in (list(range(8)), [5, 2, 7, 0, 3, 6, 1, 4]):
        mesh = Mesh(np.array([devs[i] for i in order]).reshape(2, 4), ("data", "seq"),
                    axis_types=(AxisType.Auto,) * 2)
        r = realize(denoise_step(m, pad_multiple=512), args, layout, mesh)
        evs.append(evidence_from_compiled(r.lower().compile(), target=tgt, mesh=mesh))
    assert evs[0].collectives and evs[0].placement_open() == evs[1].placement_open()
    assert set(evs[0].algorithms) == set(evs[1].algorithms)
    assert evs[1].algorithms_device_order == [5, 2, 7, 0, 3, 6, 1, 4]
    kernels = [op for op in evs[0].compute if op.custom_call_target == "tpu_custom_call"]
    # splash kernels: no compiler estimate, FLOPs from their q/k/v shapes (4 h Sq Skv d)
    assert kernels and all(op.estimated_cycles is None and op.flops > 0 for op in kernels)


@pytest.mark.tpu_compiler
def test_kernel_fused_with_a_collective_keeps_its_flops():
    """With ``xla_tpu_enable_async_collective_fusion_with_mosaic_custom_call`` libtpu fuses a
    splash kernel with the next head chunk's key/value all-gather: the fusion has no cycle
    estimate, and the kernel's flops (4 h Sq Skv d) must still be counted, as they are unfused."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from aoizora.extract.aot_compile import compile_evidence, target_mesh
    from aoizora.formulation.layout import AttentionLayout
    from aoizora.kernels.attention_kernels import sharded_attention

    b, h, s, d = 1, 4, 2048, 128
    mesh = target_mesh(get_target("v5e-8"), {"context": 8})
    layout = AttentionLayout(seq=("context",))

    def head_chunks(q, k, v):     # keys/values gathered two heads at a time
        return jnp.concatenate([
            sharded_attention(q[:, c:c + 2], k[:, c:c + 2], v[:, c:c + 2], layout=layout,
                              mesh=mesh, scale=d ** -0.5, impl="splash")
            for c in range(0, h, 2)], axis=1)

    arg = jax.ShapeDtypeStruct((b, h, s, d), jnp.bfloat16,
                               sharding=NamedSharding(mesh, P(None, None, "context", None)))
    flops, kernel_bytes = {}, {}
    for fused in (False, True):
        opts = {"xla_tpu_enable_async_collective_fusion_with_mosaic_custom_call": True} if fused else None
        ev = compile_evidence(head_chunks, [arg] * 3, mesh=mesh, target=get_target("v5e-8"),
                              compiler_options=opts)
        kernels = [op for op in ev.compute if op.flops]
        flops[fused] = sum(op.flops for op in kernels)
        kernel_bytes[fused] = sorted(op.bytes for op in kernels)
        if fused:   # the compiler did fuse a kernel: otherwise this test tests nothing
            assert any(op.kind == "fusion" for op in kernels), summarize_evidence(ev)
    # per device: two kernels of 2 heads, each attending s / 8 queries to all s keys
    assert flops[False] == flops[True] == 2 * 4.0 * 2 * (s // 8) * s * d
    # and its HBM bytes are the kernel's, not the fusion's (which hold the gather's buffers)
    assert kernel_bytes[False] == kernel_bytes[True]


CALLS = """\
HloModule calls, is_scheduled=true, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%callee (c0: f32[8]) -> f32[8] {
  %c0 = f32[8]{0} parameter(0)
  ROOT %ar.c = f32[8]{0} all-reduce(%c0), channel_id=1, replica_groups=[2,2]<=[4], to_apply=%add
}

%yes (t0: f32[8]) -> f32[8] {
  %t0 = f32[8]{0} parameter(0)
  %t0.s = f32[2]{0} slice(%t0), slice={[0:2]}
  ROOT %ag.t = f32[8]{0} all-gather(%t0.s), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}
}

%no (f0: f32[8]) -> f32[8] {
  ROOT %f0 = f32[8]{0} parameter(0)
}

ENTRY %main (p: f32[8], b: pred[]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %b = pred[] parameter(1)
  %cl = f32[8]{0} call(%p), to_apply=%callee
  ROOT %cd = f32[8]{0} conditional(%b, %cl, %cl), true_computation=%yes, false_computation=%no
}
"""


def test_call_and_conditional_are_walked():
    ev = evidence_from_hlo_text(CALLS, target="v5e:2x2", mesh_axes={"x": 4})
    by = {c.name: c for c in ev.collectives}
    assert by["ar.c"].replica_groups == [[0, 1], [2, 3]] and by["ar.c"].computation == "callee"
    assert by["ag.t"].bytes == 32 and by["ag.t"].group_size == 4
    assert any("conditional cd" in w for w in ev.warnings)


SLICED = """
HloModule sliced, is_scheduled=true, num_partitions=1

%inner (p0: bf16[30,64,128], p1: s32[]) -> bf16[1,64,128] {
  %p0 = bf16[30,64,128]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = bf16[1,64,128]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,64,128}
}

%fused (q0: bf16[30,64,128], q1: s32[], q2: bf16[1,64,128]) -> bf16[1,64,128] {
  %q0 = bf16[30,64,128]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %q2 = bf16[1,64,128]{2,1,0} parameter(2)
  %f = bf16[1,64,128]{2,1,0} fusion(%q0, %q1), kind=kLoop, calls=%inner
  ROOT %a = bf16[1,64,128]{2,1,0} add(%f, %q2)
}

ENTRY %main (w: bf16[30,64,128], i: s32[], x: bf16[1,64,128]) -> bf16[1,64,128] {
  %w = bf16[30,64,128]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %x = bf16[1,64,128]{2,1,0} parameter(2)
  ROOT %fusion.1 = bf16[1,64,128]{2,1,0} fusion(%w, %i, %x), kind=kLoop, calls=%fused
}
"""


def test_a_fusion_without_cycles_reads_only_the_slice_of_a_stacked_operand():
    """One layer's weights sliced from a stack of 30 inside a (nested) fusion: the fusion's bytes
    from shapes (early evidence has no cycles) are the slice's, not the stack's."""
    ev = evidence_from_hlo_text(SLICED, target="v5e:2x4", mesh_axes={"d": 1})
    op = next(o for o in ev.compute if o.name == "fusion.1")
    layer = 64 * 128 * 2
    assert op.estimated_cycles is None
    assert op.bytes == layer + 4 + layer + layer     # the slice, the index, x, the result
