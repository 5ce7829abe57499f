"""torch's float32 matmul peak on this machine (2048², median of 20), for the report.

python -m benchmarks.peers.torch_matmul
"""

from __future__ import annotations

import statistics
import time

from benchmarks.workloads import emit, load_average


def run(n: int = 2048, repeat: int = 20) -> dict:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    return {
        "impl": "torch",
        "n": n,
        "median_s": round(median, 5),
        "gflops_median": round(2 * n**3 / median / 1e9, 1),
        "gflops_best": round(2 * n**3 / min(times) / 1e9, 1),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1min": load_average(),
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    emit(run())
