"""The peers' GRPO runners (Tunix, TRL) and torch's matmul peak for `benchmarks.bench_grpo`.

Each module runs in the peers' virtual environment (`--peers-python`), imports only its peer
and `benchmarks.workloads` (pure Python), and prints one `RESULT {json}` line.
"""
