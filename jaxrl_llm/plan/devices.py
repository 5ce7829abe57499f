"""Accelerators' public numbers for `jaxrl_llm.plan` (HBM, FLOP/s, bandwidths)."""

from __future__ import annotations

import dataclasses

GiB = 2**30


# ------------------------------------------------------------------------------ devices


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One accelerator's public numbers (dense bf16 FLOP/s, HBM, bandwidths in bytes/s).

    `interconnect_bandwidth` is the one-way per-device bandwidth a collective along one mesh
    axis gets inside a fast domain (`fast_domain` devices: an NVLink node; `None`: the whole
    slice, TPU ICI); `network_bandwidth` applies to axes that leave the fast domain.

    Examples:
      >>> DEVICES["h100"].hbm_bytes / 1e9
      80.0
    """

    name: str
    hbm_bytes: float
    hbm_bandwidth: float
    peak_flops: float
    interconnect_bandwidth: float
    fast_domain: int | None
    network_bandwidth: float


DEVICES: dict[str, DeviceSpec] = {
    # Google Cloud TPU v5p: 459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GB/s, ICI 1200 GB/s per chip
    # (bidirectional, all links); one mesh axis is taken to get a third of the one-way total.
    "tpu-v5p": DeviceSpec(
        name="TPU v5p",
        hbm_bytes=95 * GiB,
        hbm_bandwidth=2765e9,
        peak_flops=459e12,
        interconnect_bandwidth=200e9,
        fast_domain=None,
        network_bandwidth=200e9,
    ),
    # TPU v5e: 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, ICI 400 GB/s per chip (bidirectional).
    "tpu-v5e": DeviceSpec(
        name="TPU v5e",
        hbm_bytes=16e9,
        hbm_bandwidth=819e9,
        peak_flops=197e12,
        interconnect_bandwidth=100e9,
        fast_domain=None,
        network_bandwidth=100e9,
    ),
    # NVIDIA H100 SXM: 989 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s, NVLink 450 GB/s one way
    # inside an 8-GPU node, 400 Gb/s InfiniBand (50 GB/s) per GPU between nodes.
    "h100": DeviceSpec(
        name="H100 SXM",
        hbm_bytes=80e9,
        hbm_bandwidth=3.35e12,
        peak_flops=989e12,
        interconnect_bandwidth=450e9,
        fast_domain=8,
        network_bandwidth=50e9,
    ),
    # NVIDIA H200: the H100's compute with 141 GB HBM3e at 4.8 TB/s.
    "h200": DeviceSpec(
        name="H200",
        hbm_bytes=141e9,
        hbm_bandwidth=4.8e12,
        peak_flops=989e12,
        interconnect_bandwidth=450e9,
        fast_domain=8,
        network_bandwidth=50e9,
    ),
    # NVIDIA A100 80GB SXM: 312 TFLOP/s bf16, 2.04 TB/s, NVLink 300 GB/s one way, 200 Gb/s IB.
    "a100-80gb": DeviceSpec(
        name="A100 80GB",
        hbm_bytes=80e9,
        hbm_bandwidth=2.039e12,
        peak_flops=312e12,
        interconnect_bandwidth=300e9,
        fast_domain=8,
        network_bandwidth=25e9,
    ),
}
