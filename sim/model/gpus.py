"""Accelerator descriptions: what the estimator needs to know about one device and its links.

A :class:`GpuSpec` holds the peak dense 16-bit FLOP/s (no sparsity), the memory
capacity, how many devices share a node, and the bandwidth / latency of a link
inside a node and between nodes (per device, per direction). Units: FLOP/s, bytes,
bytes/s, seconds.

Presets (``--gpu NAME``) cite the vendor datasheet next to each number. ``cpu`` is
measured on the spot: a single-threaded numpy matrix multiply (the validator runs one
thread per rank) and a memory copy (:func:`probe_cpu`; sim never imports torch).
``--gpu FILE.json`` reads the fields of :class:`GpuSpec` from a JSON object.

Compute time: a device that describes its kernels (``sm_count``, ``hbm_bandwidth``,
``gemm_efficiency``, as every GPU preset does) is timed kernel by kernel with the size-aware
model of :mod:`sim.model.efficiency`. Otherwise (a file without those fields, ``cpu``) an
estimate runs at ``peak_flops x efficiency`` with :data:`DEFAULT_MFU`; ``--mfu`` forces a
constant fraction on any device, and a measured one comes from
:func:`sim.model.estimate.calibrate_efficiency` (``--mfu-from``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from sim.errors import PipesimError
from sim.files import preset_or_file, read_spec

__all__ = ["GpuSpec", "GpuError", "PRESETS", "DEFAULT_MFU", "preset_names", "get_gpu", "load_gpu", "probe_cpu"]

DEFAULT_MFU = 0.5
"""Default model FLOP utilisation: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21), Table 1, reach 44-52% of the A100's peak for GPT models of 1.7B-1T."""


class GpuError(PipesimError):
    """A device description that cannot be used: unknown preset, bad file, non-positive numbers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One accelerator and the links it has to its peers."""

    name: str = "custom"
    """A label for reports."""
    peak_flops: float
    """Peak dense bf16/fp16 FLOP/s of one device (no structured sparsity)."""
    memory_bytes: float
    """Device memory, bytes."""
    gpus_per_node: int = 8
    """Devices that share the fast intra-node fabric (NVLink, Infinity Fabric)."""
    intra_node_bandwidth: float
    """Bytes/s one device can send to one peer in its node, per direction."""
    intra_node_latency: float = 2e-6
    """Seconds per message inside a node."""
    inter_node_bandwidth: float
    """Bytes/s one device can send to a device of another node, per direction (its NIC)."""
    inter_node_latency: float = 5e-6
    """Seconds per message between nodes."""
    sm_count: int = 0
    """Streaming multiprocessors (AMD: compute units) a GEMM's tiles run on, one wave at a time (0: unknown,
    the size-aware compute model of :mod:`sim.model.efficiency` is then off)."""
    hbm_bandwidth: float = 0.0
    """Device memory bandwidth, bytes/s (datasheet): the bound of memory-bound kernels (0: unknown)."""
    gemm_efficiency: float = 0.0
    """The best fraction of peak_flops a large 16-bit GEMM reaches in public benchmarks (0: unknown)."""
    gemm_tile: tuple[int, int] = (256, 128)
    """Output tile of one GEMM thread block, rows x columns (cuBLAS's large-GEMM tiles on Ampere/Hopper)."""
    kernel_launch: float = 4e-6
    """Seconds one kernel costs beyond its work (launch and tail; CUDA's launch latency is a few microseconds)."""
    overhead_per_layer: float = 0.0
    """Seconds each transformer block's F, B and W cost beyond their FLOPs: kernel launches and the poor use of
    the device by small matrices, which make small micro-batches slower per sample (0 in the presets: set it
    from a measurement, e.g. the validator's per-action overhead)."""

    def __post_init__(self) -> None:
        for label in ("peak_flops", "memory_bytes", "intra_node_bandwidth", "inter_node_bandwidth"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise GpuError(f"gpu {label} must be a positive finite number, got {value!r}")
        for label in ("intra_node_latency", "inter_node_latency", "overhead_per_layer"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise GpuError(f"gpu {label} must be a finite number >= 0, got {value!r}")
        if isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int) or not 0 <= self.sm_count <= 100_000:
            raise GpuError(f"gpu sm_count must be an integer in [0, 100000], got {self.sm_count!r}")
        for label in ("hbm_bandwidth", "kernel_launch"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise GpuError(f"gpu {label} must be a finite number >= 0, got {value!r}")
        eff = self.gemm_efficiency
        if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 <= eff <= 1:
            raise GpuError(f"gpu gemm_efficiency must be in [0, 1] (a fraction of peak_flops), got {eff!r}")
        tile = self.gemm_tile
        if isinstance(tile, list):
            tile = tuple(tile)
            object.__setattr__(self, "gemm_tile", tile)
        if (not isinstance(tile, tuple) or len(tile) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096 for v in tile)):
            raise GpuError(f"gpu gemm_tile must be two integers in [1, 4096] (rows, columns), got {tile!r}")
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise GpuError(f"gpus_per_node must be a positive integer, got {self.gpus_per_node!r}")

    def link(self, *, cross_node: bool) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) of a link inside a node or between nodes."""
        if cross_node:
            return self.inter_node_bandwidth, self.inter_node_latency
        return self.intra_node_bandwidth, self.intra_node_latency

    def to_dict(self) -> dict:
        out = asdict(self)
        out["gemm_tile"] = list(self.gemm_tile)
        return out


def h100_sxm() -> GpuSpec:
    """NVIDIA H100 SXM5 80GB. Datasheet (nvidia.com/en-us/data-center/h100, "H100 SXM"): BF16 Tensor Core
    1,979 TFLOPS *with sparsity* -> 989.4 TFLOPS dense; 80 GB HBM3; NVLink 900 GB/s (bidirectional, so 450 GB/s
    per direction). DGX H100: 8 GPUs per node, 8 x 400 Gb/s ConnectX-7 (one per GPU: 50 GB/s). 132 SMs and HBM3 at
    3.35 TB/s (same datasheet); large bf16 GEMMs reach 792.1 TFLOP/s, 80.1% of peak (Bekman, "Machine Learning
    Engineering", compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", CUDA 12.1)."""
    return GpuSpec(name="h100-sxm", peak_flops=989.4e12, memory_bytes=80e9, gpus_per_node=8,
                   intra_node_bandwidth=450e9, inter_node_bandwidth=50e9, sm_count=132, hbm_bandwidth=3.35e12,
                   gemm_efficiency=0.801)


def h200() -> GpuSpec:
    """NVIDIA H200 SXM 141GB. Datasheet (nvidia.com/en-us/data-center/h200): BF16 1,979 TFLOPS with sparsity ->
    989.4 dense (the H100's compute); 141 GB HBM3e; NVLink 900 GB/s bidirectional. HGX H200: 8 GPUs per node,
    400 Gb/s NIC per GPU. HBM3e at 4.8 TB/s; the H100's 132 SMs and its GEMM efficiency (the MAMF table lists
    "H100/H200 SXM" together)."""
    return GpuSpec(name="h200", peak_flops=989.4e12, memory_bytes=141e9, gpus_per_node=8,
                   intra_node_bandwidth=450e9, inter_node_bandwidth=50e9, sm_count=132, hbm_bandwidth=4.8e12,
                   gemm_efficiency=0.801)


def a100_80gb() -> GpuSpec:
    """NVIDIA A100 SXM 80GB. Datasheet (nvidia.com/en-us/data-center/a100): BF16 Tensor Core 312 TFLOPS dense;
    80 GB HBM2e; NVLink 600 GB/s bidirectional (300 per direction). DGX A100: 8 GPUs, 8 x 200 Gb/s HDR
    InfiniBand (25 GB/s per GPU). 108 SMs, HBM2e at 2,039 GB/s (same datasheet); large bf16 GEMMs reach 267.9
    TFLOP/s, 85.9% of peak (Bekman, "Machine Learning Engineering", MAMF comparison table, CUDA 12.1)."""
    return GpuSpec(name="a100-80gb", peak_flops=312e12, memory_bytes=80e9, gpus_per_node=8,
                   intra_node_bandwidth=300e9, inter_node_bandwidth=25e9, sm_count=108, hbm_bandwidth=2.039e12,
                   gemm_efficiency=0.859)


def mi300x() -> GpuSpec:
    """AMD Instinct MI300X. Datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html): peak BF16
    1307.4 TFLOPS dense; 192 GB HBM3; Infinity Fabric 896 GB/s aggregate over 7 links to the 7 peers of an
    8-GPU platform: 128 GB/s bidirectional, 64 GB/s per direction, to any one peer. 400 Gb/s NIC per GPU.
    304 compute units, HBM3 at 5.3 TB/s (same datasheet); large bf16 GEMMs reach 781.9 TFLOP/s on ROCm 6.2
    (Bekman, MAMF comparison table: 60.1% of its 1300), 59.8% of this peak."""
    return GpuSpec(name="mi300x", peak_flops=1307.4e12, memory_bytes=192e9, gpus_per_node=8,
                   intra_node_bandwidth=64e9, inter_node_bandwidth=50e9, sm_count=304, hbm_bandwidth=5.3e12,
                   gemm_efficiency=0.598)


def cpu() -> GpuSpec:
    """This machine's CPU as the validator uses it (one process per device, one thread each), measured now by
    :func:`probe_cpu`: peak = a single-threaded fp32 matrix multiply, memory = physical RAM, links = a memory
    copy (gloo on one host goes through shared memory); latency 5e-5 s, the order of a gloo send on loopback."""
    flops, copy_bandwidth = probe_cpu()
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = 8e9
    cores = os.cpu_count() or 1
    return GpuSpec(name="cpu", peak_flops=flops, memory_bytes=memory, gpus_per_node=cores,
                   intra_node_bandwidth=copy_bandwidth, intra_node_latency=5e-5,
                   inter_node_bandwidth=copy_bandwidth, inter_node_latency=5e-5)


_PROBE = """
import time, numpy as np
n = 512
a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
b = a.copy()
best = float("inf")
for _ in range(7):
    t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)
x = np.ones(2**24, dtype=np.uint8); y = np.empty_like(x)
copy = float("inf")
for _ in range(5):
    t = time.perf_counter(); np.copyto(y, x); copy = min(copy, time.perf_counter() - t)
print(2 * n**3 / best, x.nbytes / copy)
"""


@lru_cache(maxsize=1)
def probe_cpu() -> tuple[float, float]:
    """(fp32 matmul FLOP/s on one thread, memory-copy bytes/s), measured once per process.

    Runs in a child interpreter with the BLAS pools pinned to one thread, so the figure is one rank's.
    A 512 x 512 multiply costs 2 n^3 FLOPs; the best of 7 runs is kept (the least disturbed).
    """
    one = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **one}, check=True).stdout.split()
        return float(out[0]), float(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise GpuError(f"the cpu probe (a numpy matrix multiply in a child process) failed: {exc}") from None


PRESETS: dict[str, Callable[[], GpuSpec]] = {
    "h100-sxm": h100_sxm,
    "h200": h200,
    "a100-80gb": a100_80gb,
    "mi300x": mi300x,
    "cpu": cpu,
}


def preset_names() -> list[str]:
    return list(PRESETS)


def get_gpu(name_or_path: str) -> GpuSpec:
    """A preset by name, or a JSON file (anything ending in .json or naming an existing file)."""
    return preset_or_file(name_or_path, PRESETS, load_gpu, what="gpu", error=GpuError)


_REQUIRED = ("peak_flops", "memory_bytes", "intra_node_bandwidth", "inter_node_bandwidth")


def load_gpu(path: str | Path) -> GpuSpec:
    """Read a device JSON file (fields of :class:`GpuSpec`); raises :class:`GpuError` naming the problem."""
    return read_spec(path, GpuSpec, what="gpu file", error=GpuError, required=_REQUIRED)
