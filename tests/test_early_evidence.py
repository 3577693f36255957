"""Early evidence (``extract.early_evidence``, through ``candidate_pricing.early_layout_evidence``):
the compile stopped after libtpu's HLO passes gives the full compile's collectives, marked
partial; a compile that fails before the module says why."""

import dataclasses
import tempfile

import pytest

from aoizora.builtin import builtin_job
from aoizora.extract.early_evidence import FIDELITY, EarlyEvidenceError
from aoizora.extract.network import default_device_order
from aoizora.models.experts import expert_layouts
from aoizora.planning.candidate_pricing import compile_layout, early_layout_evidence

pytestmark = pytest.mark.tpu_compiler


@pytest.fixture(scope="module")
def small():
    job = builtin_job("wan2.1-small", "128p", 9, "v5e-8")
    ex = {e.name: e for e in expert_layouts(job.model, job.workload, job.target)}["fsdp_sp"]
    # a non-default order, as a placement would give
    order = list(reversed(default_device_order(job.target, ex.layout.mesh_axes)))
    return job, ex, order


def _collective(c):
    d = dataclasses.asdict(c)
    d.pop("overlap_cycles")      # the backend's cycle estimates: not in the early module
    return d


def test_early_evidence_has_the_full_compiles_collectives_and_is_partial(small, tmp_path):
    job, ex, order = small
    got = early_layout_evidence(ex.fn, ex.args, job.target, ex.layout, order, keep_dump=tmp_path)
    full = compile_layout(ex.fn, ex.args, job.target, ex.layout, order)
    early = got.evidence

    assert full.collectives and any(c.is_async for c in full.collectives)
    assert [_collective(c) for c in early.collectives] == \
        [_collective(c) for c in full.collectives]
    assert early.mesh_axes == full.mesh_axes and early.target == full.target

    assert early.fidelity == FIDELITY == "tpu-hlo-passes" and full.fidelity == "tpu"
    assert early.warnings[0].startswith("partial evidence (tpu-hlo-passes)")
    assert all(op.estimated_cycles is None for op in early.compute)
    assert any(op.estimated_cycles for op in full.compute)
    assert early.algorithms == {} and early.optimal_seconds is None
    assert early.memory.total_bytes == 0          # memory_analysis() needs the backend
    assert 0 < got.dump_memory_bytes <= full.memory.total_bytes
    assert 0 < got.module_s <= got.seconds == early.compile_s
    assert got.module_path.endswith(".after_optimizations.txt")
    assert (tmp_path / got.module_path.rsplit("/", 1)[1]).exists()


def test_a_compile_that_fails_before_the_module_is_an_error_not_a_fallback(small, tmp_path,
                                                                          monkeypatch):
    job, ex, order = small
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # where its work directory goes
    with pytest.raises(EarlyEvidenceError, match="compile failed before the module.*not a permutation"):
        early_layout_evidence(ex.fn, ex.args, job.target, ex.layout, order[:4], timeout_s=300)
    assert list(tmp_path.iterdir()) == []                        # removed on the error path too


def test_q2_refuses_partial_evidence():
    """Q2 would price early evidence's compute at 0: it refuses it instead."""
    import dataclasses
    import gzip
    import json
    from pathlib import Path

    import pytest

    from aoizora.extract.early_evidence import FIDELITY
    from aoizora.extract.evidence import Evidence
    from aoizora.extract.network import Network
    from aoizora.extract.targets import get_target
    from aoizora.formulation.latency import predict_step
    d = Path(__file__).resolve().parents[1] / "benchmarks/results/q1_fidelity/wan2.1-1.3b_480p-21f_v5e-8"
    ev = Evidence.loads(gzip.open(d / "expert_cfg2_context.evidence.json.gz", "rt").read())
    order = json.loads((d / "expert_cfg2_context.json").read_text())["device_order"]
    net = Network.from_target(get_target("v5e-8"))
    assert predict_step(ev, order, net).compute_s > 0
    with pytest.raises(ValueError, match="full compile"):
        predict_step(dataclasses.replace(ev, fidelity=FIDELITY), order, net)


def test_a_cancel_kills_the_child_and_leaves_nothing(small, tmp_path, monkeypatch):
    """The planner's screen stops a running early compile (an interrupt): the child is killed
    and its work directory removed."""
    import threading

    job, ex, order = small
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # where its work directory goes
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(EarlyEvidenceError, match="cancelled"):
        early_layout_evidence(ex.fn, ex.args, job.target, ex.layout, order, cancel=cancel)
    assert list(tmp_path.iterdir()) == []
