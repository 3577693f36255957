"""The kernel models on a device of two TensorCores (v5p megacore): the splash forward splits
its heads over the cores, the backward kernels (every grid dimension "arbitrary") run on one."""

import dataclasses

from aoizora.formulation.kernel_model import (CORES_PER_DEVICE, SplashShape, kernel_chip,
                                              splash_seconds)
from aoizora.formulation.splash_backward_model import dkv_seconds


def _chips():
    two = kernel_chip("v5p", 4.59e14, 2.765e12, 1.75e9)
    return two, dataclasses.replace(two, cores=1)


def test_cores_per_device_follow_the_devices_libtpu_shows():
    assert CORES_PER_DEVICE["v5p"] == 2 and _chips()[0].cores == 2
    assert all(kernel_chip(g, 1e14, 1e12, 1e9).cores == 1 for g in ("v4", "v5e", "v6e", "v7x"))


def test_forward_splits_heads_over_the_cores():
    two, one = _chips()
    even, odd = SplashShape(32, 4096, 4096, 128), SplashShape(1, 4096, 4096, 128)
    # compute-bound: each core runs half the heads on half the device's MXUs, at the same clock
    assert splash_seconds(even, 512, 512, 512, two) < 0.75 * splash_seconds(even, 512, 512, 512,
                                                                             one)
    # one head cannot be split: its steps run on one core's MXUs
    assert splash_seconds(odd, 512, 512, 512, two) >= splash_seconds(odd, 512, 512, 512, one)


def test_backward_runs_on_one_core():
    two, one = _chips()
    shape = SplashShape(32, 4096, 4096, 128)
    assert dkv_seconds(shape, 512, 512, 512, two, fused=True) >= dkv_seconds(
        shape, 512, 512, 512, one, fused=True)
