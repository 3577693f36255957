"""A PyTorch plan that cannot be priced says why in one line (issue 49)."""


def test_torch_plan_failure_says_why_once_with_the_smallest_need():
    """When no torch candidate is priced, the error gives each reason once with its count and,
    for HBM, the smallest per-device need against the usable HBM (no torch needed)."""
    import types

    from aoizora.extract.evidence import MemoryUse
    from aoizora.planning.torch_planner import _why_none

    GiB = 1024 ** 3

    def cand(temp, error=""):
        ev = types.SimpleNamespace(memory=MemoryUse(temp_bytes=temp * GiB, hbm_bytes=80 * GiB,
                                                    fits=False))
        return types.SimpleNamespace(error=error, evidence=ev)

    why = _why_none([cand(209), cand(105), cand(300), cand(1, "CompileError: x")])
    assert why.count("does not fit in HBM") == 1 and "(3 of 4 candidates)" in why
    assert "CompileError: x (1 of 4 candidates)" in why
    assert "the smallest needs 105.0 GiB per device against 80.0 GiB usable" in why
