import math

import pytest

from aoizora.formulation.meshes import candidate_meshes


@pytest.mark.parametrize("n,expected", [
    (8, [(8,), (2, 4), (4, 2), (2, 2, 2)]),
    (4, [(4,), (2, 2)]),
    (1, [(1,)]),
])
def test_factorizations(n, expected):
    assert [tuple(m.values()) for m in candidate_meshes(n)] == expected


@pytest.mark.parametrize("n", [6, 16, 64, 256])
def test_every_candidate_multiplies_to_n(n):
    ms = candidate_meshes(n)
    assert all(math.prod(m.values()) == n and 1 <= len(m) <= 3 for m in ms)
    assert len({tuple(m.values()) for m in ms}) == len(ms)
