"""Replica groups in every spelling: hand-written strings and real XLA:TPU output."""

import numpy as np
import pytest

from aoizora.extract.replica_groups import (ReplicaGroupError, parse_iota_array,
                                            parse_replica_groups, parse_source_target_pairs)

# ---------------------------------------------------------------------------------------------
# Hand-written strings (expected groups worked out by hand from XLA's definitions)


def test_explicit_lists():
    assert parse_replica_groups("{{0,1},{2,3}}", 4) == [[0, 1], [2, 3]]
    assert parse_replica_groups("{{0,2,4,6},{1,3,5,7}}", 8) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert parse_replica_groups("{ {3, 1}, {0,2} }", 4) == [[3, 1], [0, 2]]  # order kept


def test_empty_groups_mean_all_devices():
    assert parse_replica_groups("{}", 8) == [list(range(8))]
    assert parse_replica_groups(None, 4) == [[0, 1, 2, 3]]


def test_iota_without_transpose():
    assert parse_replica_groups("[2,4]<=[8]", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert parse_replica_groups("[1,8]<=[8]", 8) == [list(range(8))]


def test_iota_with_transpose():
    # arange(8).reshape(4,2).T = [[0,2,4,6],[1,3,5,7]]
    assert parse_replica_groups("[2,4]<=[4,2]T(1,0)", 8) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # arange(8).reshape(2,4).T -> columns of a 2x4 mesh
    assert parse_replica_groups("[4,2]<=[2,4]T(1,0)", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # a 3-d reshape: arange(16).reshape(2,4,2).transpose(0,2,1) -> groups of 4 at stride 2
    assert parse_replica_groups("[4,4]<=[2,4,2]T(0,2,1)", 16) == [
        [0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]


def test_iota_array_forms():
    assert parse_iota_array("[2,8]T(1,0)").tolist() == np.arange(16).reshape(2, 8).T.tolist()
    assert parse_iota_array("[4,2]<=[8]").tolist() == np.arange(8).reshape(4, 2).tolist()


def test_mesh_form_without_device_ids():
    # mesh a=2, b=4 (iota ids): grouping over b gives the rows
    assert parse_replica_groups("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", 8) == [
        [0, 1, 2, 3], [4, 5, 6, 7]]
    assert parse_replica_groups("mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", 8) == [
        [0, 4], [1, 5], [2, 6], [3, 7]]
    # two grouped axes: all devices, in the listed order
    assert parse_replica_groups("mesh['a'=4,'b'=2] {'a','b'}", 8) == [list(range(8))]
    assert parse_replica_groups("mesh['a'=4,'b'=2] {'b','a'}", 8) == [[0, 2, 4, 6, 1, 3, 5, 7]]


def test_mesh_form_with_device_ids():
    # device ids: arange(16).reshape(2,8).T = [[0,8],[1,9],...] flattened; mesh [1,8,1,2];
    # grouping over axis_1 (size 8) -> the two rows of the original 2x8 arrangement
    s = "mesh['axis_0'=1,'axis_1'=8,'axis_2'=1,'axis_3'=2], device_ids=([2,8]T(1,0)) {'axis_1'}"
    assert parse_replica_groups(s, 16) == [list(range(8)), list(range(8, 16))]
    # mesh [4,2,2] of the same ids, grouping over the last axis: pairs {r, r+8}
    s = "mesh['axis_0'=4,'axis_1'=2,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_2'}"
    assert parse_replica_groups(s, 16) == [[i, i + 8] for i in range(8)]
    # an 8-long axis decomposed: ids arange(8).reshape(4,2).T flattened = 0,2,4,6,1,3,5,7
    s = "mesh['axis_0'=1,'axis_1'=2,'axis_2'=4,'axis_3'=1], device_ids=([4,2]T(1,0)) {'axis_2'}"
    assert parse_replica_groups(s, 8) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_mesh_form_with_sub_axes():
    # 'a':(1)2 is the major half of a=8 (reshape [1,2,4], group over the 2): stride 4
    assert parse_replica_groups("mesh['a'=8] {'a':(1)2}", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # 'a':(2)4 is the minor 4 (reshape [2,4,1]): contiguous runs of 4
    assert parse_replica_groups("mesh['a'=8] {'a':(2)4}", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # two sub-axes of one axis: [2,2,2], group over dims 0 and 2
    assert parse_replica_groups("mesh['a'=8] {'a':(1)2,'a':(4)2}", 8) == [
        [0, 1, 4, 5], [2, 3, 6, 7]]


def test_source_target_pairs():
    assert parse_source_target_pairs("{{0,1},{1,2},{2,0}}") == [(0, 1), (1, 2), (2, 0)]
    assert parse_source_target_pairs("{}") == []


@pytest.mark.parametrize("bad", ["[2,4]<=[9]", "{{0,1},{1,2}}", "mesh['a'=2] {'z'}", "banana",
                                 "{{0,9}}", "[2,4]<=[4,2]T(0,0)"])
def test_bad_spellings_raise(bad):
    with pytest.raises(ReplicaGroupError):
        parse_replica_groups(bad, 8)


def test_bad_pairs_raise():
    with pytest.raises(ReplicaGroupError):
        parse_source_target_pairs("{{0,1,2}}")
    with pytest.raises(ReplicaGroupError):
        parse_source_target_pairs("{{0,8}}", 8)


# ---------------------------------------------------------------------------------------------
# Real compiler output


def _compile_text(mesh_shape, names, fn, specs_shapes, target, dtype="float32"):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    from aoizora.extract.targets import get_target

    devs = get_target(target).devices()
    mesh = Mesh(np.array(devs).reshape(mesh_shape), names,
                axis_types=(AxisType.Auto,) * len(names))
    args = [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=NamedSharding(mesh, P(*spec)))
            for shape, spec in specs_shapes]
    with jax.set_mesh(mesh):
        return jax.jit(fn).lower(*args).compile().as_text()


def _groups_in(text, n):
    from aoizora.extract.hlo import parse_hlo_module

    mod = parse_hlo_module(text)
    out = []
    for comp in mod.computations.values():
        for ins in comp.instructions:
            if "replica_groups" in ins.attrs:
                out.append((ins.opcode, ins.attrs["replica_groups"],
                            parse_replica_groups(ins.attrs["replica_groups"], n)))
    return out


def _is_partition(groups, n):
    flat = sorted(i for g in groups for i in g)
    return flat == list(range(n)) and len({len(g) for g in groups}) == 1


@pytest.mark.tpu_compiler
def test_real_output_two_axis_mesh_all_spellings():
    """A scanned MLP's gradient on a 2x4 mesh shows explicit, iota and mesh-form groups, and each
    one is a row (axis m) or a column (axis d) of the mesh."""
    import jax

    L, D, F, T = 4, 512, 1024, 1024

    def layer(x, w):
        wq, wo, w1, w2 = w
        x = x + jax.nn.gelu(x @ wq) @ wo
        return x + jax.nn.gelu(x @ w1) @ w2, None

    def loss(x, wq, wo, w1, w2):
        return jax.lax.scan(layer, x, (wq, wo, w1, w2))[0].sum()

    w_spec = (None, "m", None)
    text = _compile_text((2, 4), ("d", "m"), jax.grad(loss, argnums=(1, 2, 3, 4)),
                         [((T, D), ("d", None)), ((L, D, D), w_spec), ((L, D, D), w_spec),
                          ((L, D, F), w_spec), ((L, F, D), w_spec)], "v5e:2x4", "bfloat16")
    found = _groups_in(text, 8)
    spellings = {("mesh" if s.startswith("mesh") else "iota" if s.startswith("[") else "explicit")
                 for _, s, _ in found}
    assert {"mesh", "iota"} <= spellings, spellings
    rows = np.arange(8).reshape(2, 4).tolist()
    cols = np.arange(8).reshape(2, 4).T.tolist()
    for op, s, groups in found:
        assert _is_partition(groups, 8), (op, s, groups)
        assert sorted(map(sorted, groups)) in (sorted(rows), sorted(cols)), (op, s, groups)


@pytest.mark.tpu_compiler
def test_real_output_explicit_groups():
    text = _compile_text((2, 4), ("d", "m"), lambda a, b: a @ b,
                         [((256, 512), ("d", "m")), ((512, 128), ("m", None))], "v5e:2x4")
    found = _groups_in(text, 8)
    assert any(s.startswith("{") for _, s, _ in found)
    assert all(g == [[0, 1, 2, 3], [4, 5, 6, 7]] for op, s, g in found if op == "all-reduce")


@pytest.mark.tpu_compiler
def test_real_output_mesh_device_ids_and_decomposed_axis():
    """On a 1-D mesh of 8, a reshape splits the 8-long axis: the compiler emits mesh-form groups
    with a transposed device_ids over sub-axes of 4 and of 2 (strided subsets of the axis)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def split4(x):  # (512,) sharded 8 ways -> (4, 128) with the 128 sharded 8 ways
        return jnp.sin(jax.lax.with_sharding_constraint(x.reshape(4, 128, 256), P(None, "a", None)))

    def split2(x):
        return jnp.sin(jax.lax.with_sharding_constraint(x.reshape(2, 256, 256), P(None, "a", None)))

    seen = {}
    for name, fn in (("4", split4), ("2", split2)):
        text = _compile_text((8,), ("a",), fn, [((512, 256), ("a", None))], "v5e:2x4")
        for op, s, groups in _groups_in(text, 8):
            assert _is_partition(groups, 8), (s, groups)
            if "device_ids=" in s:
                seen[name] = (s, groups)
    assert set(seen) == {"4", "2"}, seen
    # read by hand from the printed strings (see test_mesh_form_with_device_ids)
    assert seen["4"][1] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert seen["2"][1] == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.tpu_compiler
def test_real_output_source_target_pairs():
    import jax.numpy as jnp

    from aoizora.extract.hlo import parse_hlo_module

    text = _compile_text((8,), ("a",), lambda x: jnp.roll(x, 1, axis=0),
                         [((256, 128), ("a", None))], "v5e:2x4")
    mod = parse_hlo_module(text)
    pairs = [parse_source_target_pairs(i.attrs["source_target_pairs"], 8)
             for c in mod.computations.values() for i in c.instructions
             if "source_target_pairs" in i.attrs]
    assert pairs
    # rolling by one row along a sharded axis: every shard sends to its right neighbour
    assert sorted(pairs[0]) == sorted((i, (i + 1) % 8) for i in range(8))
