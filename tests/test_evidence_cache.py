"""The evidence cache: a hit returns the compile's evidence without compiling, a corrupt or
truncated entry is reported in one line and recompiled, the size limit evicts the least recently
used entries, and two processes writing one key leave one whole entry."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from aoizora.extract.targets import get_target
from aoizora.extract.aot_compile import compile_evidence, keeping_hlo, read_hlo, target_mesh
from aoizora.extract.evidence import Evidence, MemoryUse
from aoizora.extract.atomic_io import atomic_write
from aoizora.extract.evidence_cache import CacheError, EvidenceCache, cache_dir, open_cache

pytestmark = pytest.mark.tpu_compiler


def _mm(x, w):
    return jnp.tanh(x @ w)


ARGS = (jax.ShapeDtypeStruct((256, 512), jnp.bfloat16),
        jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16))


def _compile(cache, order=None, options=None):
    target = get_target("v5e-8")
    mesh = target_mesh(target, {"x": 2, "y": 4}, order)
    return compile_evidence(_mm, ARGS, mesh=mesh, target=target,
                            in_shardings=(P("x", None), P(None, "y")), cache=cache,
                            compiler_options=options)


def _same(a, b) -> bool:
    """Equal evidence up to the compile's wall time."""
    da, db = a.to_json(), b.to_json()
    da.pop("compile_s"), db.pop("compile_s")
    return da == db


def test_a_hit_is_the_compiles_evidence_and_any_change_of_key_is_a_miss(tmp_path):
    c = EvidenceCache(tmp_path)
    first = _compile(c)
    assert first.source == "" and c.stats()["misses"] == 1 and c.stats()["writes"] == 1
    again = _compile(c)
    assert again.source == "cache" and again == first and c.hits == 1
    assert again.compile_s == first.compile_s       # the compile that made the entry
    # another device order, other options: other keys, compiled
    other = _compile(c, order=[0, 1, 2, 3, 7, 6, 5, 4])
    assert other.source == "" and c.misses == 2
    opt = _compile(c, options={"xla_tpu_enable_ici_ag_pipelining": True})
    assert opt.source == "" and c.misses == 3 and len(c.entries()) == 3


def test_kept_hlo_comes_back_from_the_cache(tmp_path):
    c = EvidenceCache(tmp_path / "c")
    plain = _compile(c)                         # stored without HLO
    with keeping_hlo(tmp_path / "h1"):
        ev = _compile(c)                        # HLO wanted: an entry without it is a miss
    assert ev.source == "" and "ENTRY" in read_hlo(ev) and _same(ev, plain)
    with keeping_hlo(tmp_path / "h2"):
        hit = _compile(c)
    assert hit.source == "cache" and read_hlo(hit) == read_hlo(ev)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_corrupt_entry_is_reported_in_one_line_and_recompiled(tmp_path, damage):
    lines = []
    c = EvidenceCache(tmp_path, report=lines.append)
    good = _compile(c)
    (_, _, path), = c.entries()
    raw = open(path, "rb").read()
    bad = {"truncate": raw[: len(raw) // 2],
           "flip": raw[:-5] + bytes([raw[-5] ^ 0xFF]) + raw[-4:],
           "garbage": b"not an entry"}[damage]
    with open(path, "wb") as f:
        f.write(bad)
    again = _compile(c)
    assert again.source == "" and _same(again, good)            # recompiled, never trusted
    assert len(lines) == 1 and "\n" not in lines[0] and "corrupt entry" in lines[0]
    assert c.corrupt == 1 and c.notes == lines
    assert _compile(c).source == "cache"                     # the recompile was stored again


def _evidence(n_warnings: int) -> Evidence:
    return Evidence(target="v5e:2x4", mesh_axes={"x": 8}, memory=MemoryUse(fits=True),
                    warnings=[f"w{i} " + "x" * 200 for i in range(n_warnings)])


def test_the_size_limit_evicts_the_least_recently_used(tmp_path):
    c = EvidenceCache(tmp_path, limit_bytes=10**6)
    c.put("a" * 64, _evidence(1))
    size = c.size_bytes()
    c.limit_bytes = int(size * 3.5)
    for i, k in enumerate(["b", "c"]):
        c.put(k * 64, _evidence(1))
    for k, t in zip("abc", (100, 200, 300)):
        os.utime(c.path(k * 64), (t, t))
    assert c.get("a" * 64) is not None      # a hit: "a" is now the most recently used
    c.put("d" * 64, _evidence(1))           # 4 entries > 3.5: evict down to 0.9 x 3.5 = 3.15
    left = {os.path.basename(p)[0] for _, _, p in c.entries()}
    assert left == {"a", "c", "d"} and c.evicted == 1
    assert c.size_bytes() <= c.limit_bytes


def test_location_and_bad_input(tmp_path, monkeypatch):
    assert cache_dir({"AOIZORA_CACHE": "/x/y"}) == "/x/y"
    assert cache_dir({"XDG_CACHE_HOME": "/c"}, "linux") == "/c/aoizora"
    assert cache_dir({}, "darwin").endswith("Library/Caches/aoizora")
    assert cache_dir({"LOCALAPPDATA": "C:/L"}, "win32").replace("\\", "/") == "C:/L/aoizora/Cache"
    assert open_cache(None) is None and open_cache(False) is None
    monkeypatch.setenv("AOIZORA_CACHE", str(tmp_path / "env"))
    assert open_cache(True).directory == str(tmp_path / "env")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CacheError, match="is a file"):
        open_cache(str(f))
    with pytest.raises(CacheError, match="positive"):
        EvidenceCache(tmp_path, limit_bytes=0)


def test_atomic_write_replaces_whole(tmp_path):
    p = tmp_path / "f"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two" and os.listdir(tmp_path) == ["f"]


_WRITER = textwrap.dedent("""
    import sys
    from aoizora.extract.evidence import Evidence, MemoryUse
    from aoizora.extract.evidence_cache import EvidenceCache
    c = EvidenceCache(sys.argv[1])
    for i in range(60):
        ev = Evidence(target="v5e:2x4", mesh_axes={"x": 8}, memory=MemoryUse(fits=True),
                      warnings=[sys.argv[2] * (1000 + 37 * i)])
        c.put("k" * 64, ev)
""")


def test_two_processes_writing_one_key_leave_one_whole_entry(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), tag])
             for tag in "AB"]
    reader, seen = EvidenceCache(tmp_path, report=lambda line: None), set()
    while any(p.poll() is None for p in procs):
        hit = reader.get("k" * 64)
        if hit is not None:
            seen.add(hit.evidence.warnings[0][0])
    assert all(p.wait() == 0 for p in procs)
    assert reader.corrupt == 0                       # never a partial entry
    final = reader.get("k" * 64)
    assert final is not None and final.evidence.warnings[0][0] in "AB"
    assert [n for n in os.listdir(tmp_path / "kk")] == ["k" * 64 + ".ev"]   # no temporaries
