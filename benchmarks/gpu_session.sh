#!/usr/bin/env bash
# The GPU measurements of one lent-machine session, as one command (≈ 7-9 min on an H100, most
# of it compiling; the parts' time limits add up to 560 s, under the device tool's 600 s per
# call; docs/performance.md, "On a GPU"):
#
#   benchmarks/gpu_session.sh OUT_DIR [ARGS...]     ARGS go to every bench_gpu call
#   PYTHON=.venv/bin/python benchmarks/gpu_session.sh /tmp/g --tiny    a smoke run on a CPU
#
#   p1  the benchmark (decode at batch 64, the GRPO update step) with the card's measured
#       ceilings and a profile of each part (benchmarks/profile_summary.py: busy time per CUDA
#       stream against its span, and the top kernels);
#   p2  the default decode with XLA's command buffers for loops (the decode while_loop as a CUDA
#       graph): XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL;
#   p3  the same flags with every layer unrolled (layer_unroll 24);
#   p4  default flags: the layer scan in groups of 4, and the update at 32 sequences;
#   p5  default flags: 8 decode steps per while-loop iteration as an inner loop of fixed trip
#       count (unroll_loop_steps false), which XLA runs without reading a condition back to
#       the host: one round trip per 8 steps without unrolling the step;
#   p6  the update step with cuDNN's flash attention (Decoder(fused_attention=True)), and with
#       the log-probs in chunks of 64 positions per row (16 rows × 64 = 1,024 positions: the
#       151,936-token logits of the 8,192 positions not materialised at once; a chunk of the
#       row's whole 496 completion positions or more is no chunking).
#
# Parts p2-p6 each change one lever against p1's defaults. Each part runs in its own
# process under a time limit and writes OUT_DIR/pN/bench_gpu.json as it goes, so a part that
# fails or runs out of time keeps what it measured and the next part still runs; inside a part
# a variant or a profile that fails is recorded as an error and the next one runs. The log is
# OUT_DIR/log.txt.
#
# With the device tool: command `bash benchmarks/gpu_session.sh $OUT`, timeout_s 600, nothing
# carried (the machine's own python3 has jax with CUDA; this machine's .venv does not run
# there), give the machine back right after. It returns 8 files (log.txt, smi.txt and
# p1..p6/bench_gpu.json); copy each pN/bench_gpu.json to benchmarks/results/gpu/<card>_pN.json
# for `python -m benchmarks.report`.
set -u
out=${1:?usage: benchmarks/gpu_session.sh OUT_DIR [ARGS...]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
bench=("${PYTHON:-python3}" -m benchmarks.bench_gpu "$@")
graphs="XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
part() {  # part NAME SECONDS [env VAR=...] ARGS...
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" >>"$out/log.txt" 2>&1
    echo "== $name: exit $?" | tee -a "$out/log.txt"
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv >"$out/smi.txt" 2>&1
part p1 110 "${bench[@]}" --out "$out/p1" --repeat 10 --profile
part p2 70 env "$graphs" "${bench[@]}" --out "$out/p2" --skip ceilings update
part p3 110 env "$graphs" "${bench[@]}" --out "$out/p3" --skip ceilings decode update \
    --variants --update-variants '[]' --decode-variants '[{"layer_unroll": 24}]'
part p4 110 "${bench[@]}" --out "$out/p4" --skip ceilings decode update --variants \
    --update-variants '[{"rows": 32}]' --decode-variants '[{"layer_unroll": 4}]'
part p5 70 "${bench[@]}" --out "$out/p5" --skip ceilings decode update --variants \
    --update-variants '[]' --decode-variants '[{"steps_per_loop": 8, "unroll_loop_steps": false}]'
part p6 90 "${bench[@]}" --out "$out/p6" --skip ceilings decode update --variants \
    --decode-variants '[]' --update-variants '[{"fused_attention": true}, {"chunk_size": 64}]'
