"""`jaxrl-llm plan`: per-device memory and a rough time split of one RL iteration, before renting.

Given a model (a preset name, a `config.json`, or a `ModelConfig`), a mesh `(data, fsdp,
tensor)`, the rollout shape and dtypes, `estimate` computes what each device holds and where an
iteration's time goes. Nothing is allocated: parameter shapes and logical axes come from
`parameter_shapes` (the `Decoder`'s layout, checked against the real model by the tests) and
each tensor's per-device size from the same rule table that places the real parameters
(`sharding.LOGICAL_AXIS_RULES`), so a dimension the mesh does not divide is counted replicated,
exactly as it would be.

Notation: mesh `d × f × t` (data, fsdp, tensor), `n = d·f·t` devices; `B` prompts, `G` samples
each, `N = B·G` sequences of `S = P + T` tokens (prompt, completion); `m` sequences per
micro-batch; `L` layers, `D` width, `F` MLP width, `H` / `K` query / KV heads of size `Hd`,
`V` vocabulary. `‖x‖_dev` is the per-device share of `x` under the rule table (≈ `x / (f·t)`
for weights). Bytes: `b_p` parameters (and their copies: reference, gathered sampler weights),
`b_o` optimizer moments (by default `b_p`: optax's moments follow the parameters' dtype), `b_c`
compute (activations, KV cache).

Memory per device (bytes):

    params      = ‖W‖_dev · b_p
    optimizer   = 2 · ‖W‖_dev · b_o                    (AdamW: first and second moments)
    accumulator = ‖W‖_dev · 4                          (micro-batches below an update: MultiSteps'
                                                        float32 running mean of the gradients)
    gradients   = ‖W‖_dev · b_p                        (reduce-scattered onto the params' layout)
    reference   = ‖W‖_dev · b_p                        (frozen KL reference, optional)
    layer_bufs  = 2 · ‖W_layer‖_t · b_c                (a layer gathered over fsdp, twice)
    activations = L · a_saved · m/(d·f) · S + a_layer (with remat) + logits
    sampler     = ‖W‖_t · b_p                          (gathered over fsdp, split over tensor;
                                                        0 on fsdp = 1 without adapters)
    kv_cache    = 2 · L · N/(d·f) · S · K_t · Hd · b_c (K_t = K/t if t divides K, else K)

with `‖·‖_t` the share when split over tensor only. With LoRA adapters of rank `r`
(`lora_rank`: every projection, `models.add_lora`; `‖A‖` their elements, named like their
weights, with `dora` also DoRA's magnitudes, one per output feature): params = (‖W‖_dev + ‖A‖_dev)·b_p; optimizer, gradients and the reference hold the
adapters only (2·‖A‖_dev·b_o, ‖A‖_dev·b_p, ‖A‖_dev·b_p); the sampler holds (‖W‖_t + ‖A‖_t)·b_p
(on fsdp = 1 the merged weights, ‖W‖_t·b_p);
the update's matmuls take 4·W_mm instead of 6·W_mm FLOPs per token (no weight gradient of the
base), and only the adapters' gradients are reduced. Saved activations per token and layer
(`H_t = H/t`, `F_t = F/t`): without remat
`b_c·(4D + 3(H_t + K_t)·Hd + 4F_t) + (4 + b_c)·H_t·S` (norm inputs and outputs, projections,
float32 attention logits and probabilities, MLP gates); `remat="dots"` keeps the matmul outputs
`b_c·(3D + (H_t + 2K_t)·Hd + 2F_t)`; `remat="full"` keeps the layer input `b_c·D`, and both
recompute one layer (`a_layer`, the no-remat figure for one layer) in the backward pass.
With attention in blocks of `C` queries (`attention_chunk`, the model's `attention_chunk`) no
layer keeps its attention logits: the `(4 + b_c)·H_t·S` per token becomes
`m/(d·f) · (min(C, S) · (4 + b_c)·H_t·S + S²)` per recomputed layer (one block, and the
`[S, S]` boolean mask of each sequence), for one more attention forward in the update.
Logits: `2 · 4 · V/t` bytes per completion token (float32 logits and their cotangent) over
`min(m/(d·f) · T, logits_chunk)` tokens (only completion positions are scored; the update
step's `chunk_size` positions of `m/(d·f)` rows give `logits_chunk = m/(d·f) · chunk_size`).

PPO's separate critic (`critic`: a `ValueModel` of the policy's architecture, `critic_shapes`:
the decoder without its LM head, plus a `[D, 1]` value head; `‖C‖` its elements) adds
`‖C‖_dev · b_p` of parameters, `2 · ‖C_trained‖_dev · b_o` of AdamW moments and
`‖C_trained‖_dev · b_p` of gradients (`C_trained`: the whole critic, or with `critic_lora_rank`
its adapters and head), and the saved activations of its forward, which runs beside the
policy's in the update (`saved` above, without logits). Its time: one forward over the `N · S`
tokens for the rollout's values, `6·C_mm` (LoRA: `4·C_mm`) plus the attention passes per token
in the update, and its gathers, gradient reductions and activation all-reduces beside the
policy's.

Peak = max(sampling phase, training phase). Sampling holds params + optimizer + accumulator +
reference + sampler weights + KV cache + workspace; training holds params + optimizer +
accumulator + gradients + reference + layer buffers + activations (`H_t`, `F_t`: split over
tensor where it divides them, else whole, as the rule table places them). The sampling workspace is the larger of the decode
step's `N/(d·f) · (8·V/t + 4·H_t·S)` (float32 logits and their filtered copy, one layer's
attention logits) and the prefill's `⌈B/(d·f)⌉ · P · (b_c·(D + (H_t + 2K_t)·Hd + 2F_t) +
4·H_t·P)` (one layer live).

Time of one iteration (seconds), FLOP-bound phases at `mfu · peak_flops` per device, the
decode loop at `bandwidth_efficiency · hbm_bandwidth`:

    prefill  = B · P · (2·W_mm + 4·L·H·Hd·P) / (n · mfu · peak)
    decode   = T · max(bytes_step / (eff · hbm_bw), flops_step / (mfu · peak))
      bytes_step = ‖W‖_t · b_c + 2·L·N/(d·f)·S·K_t·Hd·b_c        (weights + the whole cache)
      flops_step = N/(d·f) · (2·W_mm/t + 4·L·H_t·Hd·S)
    logprobs = passes · N · S · (2·W_mm + 4·L·H·Hd·S) / (n · mfu · peak)
    training = epochs · N · S · (6·W_mm + a·4·L·H·Hd·S) · r / (n · mfu · peak)

Each decode step attends over all `S` slots of the fixed-size cache (masked), as the `Decoder`
does, so the cache term does not shrink for early steps. `W_mm` counts the weights used in
matmuls (all but the embedding lookup; the output projection counts once). `a = 3` attention
passes (forward and backward), 4 with attention in blocks. `6·W·tokens` is the usual
forward + backward estimate (Kaplan et al., "Scaling Laws for Neural Language Models",
arXiv:2001.08361); `r = 4/3` with full remat (one more forward); `passes` counts the old-policy
forward pass (needed when a rollout feeds more than one optimizer update,
`epochs · minibatches > 1`; on-policy updates reuse the current log-probs; none with
`old_logprobs="sampler"`, where the sampler's log-probs stand in) and the reference policy's
(optional).

Collectives of the update are reported separately, as if not overlapped with compute
(`train_comm_s`, per micro-batch, at the bandwidth of the link each mesh axis crosses; devices
are laid out tensor-innermost, so on GPUs an axis stays on NVLink while the product of it and
the axes inside it fits a node):

    fsdp    (g · ‖W‖_t · b_c + ‖W‖_t · b_p) · (f − 1)/f    (g = 2 weight all-gathers, 3 with
                                                           full remat; gradient reduce-scatter)
    data    2 · ‖W‖_dev · b_p · (d − 1)/d                  (gradient all-reduce)
    tensor  g · 2L · 2(t − 1)/t · m/(d·f) · S · D · b_c     (two activation all-reduces a layer)

The decode loop's tensor-parallel all-reduces (`2L` small ones per step) are latency-bound and
not modelled.

This is an estimate to choose a mesh with, not a promise: it ignores XLA's temporary buffers,
fragmentation and host offloading; keep a margin of 10–20% below the HBM size.
"""

from __future__ import annotations

from jaxrl_llm.plan.devices import DEVICES, DeviceSpec, GiB
from jaxrl_llm.plan.estimate import Plan, PlanConfig, estimate, mesh_candidates, suggest_meshes
from jaxrl_llm.plan.report import build_parser, format_plan, main, plan_to_dict, run
from jaxrl_llm.plan.shapes import PRESETS, ParamShape, parameter_shapes, resolve_model

__all__ = [
    "DEVICES",
    "PRESETS",
    "DeviceSpec",
    "GiB",
    "ParamShape",
    "Plan",
    "PlanConfig",
    "build_parser",
    "estimate",
    "format_plan",
    "main",
    "mesh_candidates",
    "parameter_shapes",
    "plan_to_dict",
    "resolve_model",
    "run",
    "suggest_meshes",
]
