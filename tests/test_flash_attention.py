"""The GPU flash-attention kernel model: FlashAttention-2's and -3's published utilization, and
FA2's ceiling on Hopper parts."""

import pytest

from aoizora.formulation.flash_attention import (FA2_HOPPER_CEILING_FLOPS, T_HALF,
                                                 flash_attention_seconds, flash_rate)

H100, A100, H20 = 989.4e12, 312e12, 148e12
LONG = 10**9            # keys: the saturating curve at its top


def test_fa2_reaches_its_ampere_fraction_and_hopper_caps_it():
    assert flash_rate(LONG, A100) == pytest.approx(0.73 * A100, rel=1e-6)
    assert flash_rate(LONG, H100, hopper=True) == pytest.approx(0.35 * H100, rel=1e-6)
    # a Hopper part with a small peak reaches the Ampere fraction of its own peak first
    assert flash_rate(LONG, H20, hopper=True) == pytest.approx(0.73 * H20, rel=1e-6)
    assert flash_rate(LONG, H100, kernel="fa3", hopper=True) == pytest.approx(0.75 * H100,
                                                                             rel=1e-6)
    assert FA2_HOPPER_CEILING_FLOPS < 0.73 * H100


def test_short_key_sequences_run_at_half_the_rate_and_time_follows():
    assert flash_rate(int(T_HALF), A100) == pytest.approx(0.5 * 0.73 * A100)
    b, h, s, t, d = 1, 24, 4096, 32768, 128
    fa2 = flash_attention_seconds(b, h, s, t, d, H100, 3.35e12, hopper=True)
    fa3 = flash_attention_seconds(b, h, s, t, d, H100, 3.35e12, kernel="fa3", hopper=True)
    assert fa2 / fa3 == pytest.approx(0.75 / 0.35, rel=1e-6)
    assert flash_attention_seconds(0, h, s, t, d, H100, 3.35e12) == 0.0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="kernel"):
        flash_rate(4096, H100, kernel="fa9")
    with pytest.raises(ValueError, match="positive"):
        flash_attention_seconds(1, 1, 1, 1, 1, 0.0, 1.0)
