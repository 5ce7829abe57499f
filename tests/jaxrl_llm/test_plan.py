"""`jaxrl_llm.plan`: parameter layout vs the real model, memory/time formulas, mesh errors, CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig, RopeConfig
from jaxrl_llm.plan import (
    DEVICES,
    PRESETS,
    PlanConfig,
    estimate,
    main,
    mesh_candidates,
    parameter_shapes,
    resolve_model,
    suggest_meshes,
)
from jaxrl_llm.plan.shapes import critic_shapes, lora_shapes

BASE = {
    "vocab_size": 48,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_layers": 3,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 4,
}
FAMILIES = {
    "llama_bias_untied": ModelConfig(family="llama", attention_bias=True, **BASE),
    "qwen2_tied": ModelConfig(family="qwen2", tie_embeddings=True, **BASE),
    "qwen3": ModelConfig(family="qwen3", **BASE),
    "gemma": ModelConfig(family="gemma", tie_embeddings=True, activation="gelu_tanh", **BASE),
    "gemma2": ModelConfig(
        family="gemma2",
        tie_embeddings=True,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"),
        sliding_window=4,
        attn_logit_softcap=50.0,
        final_logit_softcap=30.0,
        query_pre_attn_scalar=4.0,
        **BASE,
    ),
    "gemma3_text": ModelConfig(
        family="gemma3_text",
        tie_embeddings=True,
        layer_types=("sliding_attention", "sliding_attention", "full_attention"),
        sliding_window=4,
        local_rope=RopeConfig(theta=10000.0),
        **BASE,
    ),
}


def model_shapes(factory):
    """`{path: (shape, logical axes)}` of every parameter of the module `factory()` builds."""
    state = nnx.state(nnx.eval_shape(factory), nnx.Param)
    return {
        ".".join(map(str, key)): (var.get_value().shape, tuple(var.get_metadata()["out_sharding"]))
        for key, var in nnx.to_flat_state(state)
    }


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_parameter_shapes_are_the_models_parameters(name):
    config = FAMILIES[name]
    actual = model_shapes(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    planned = {p.path: (p.shape, p.names) for p in parameter_shapes(config)}
    assert planned == actual
    count = sum(math.prod(shape) for shape, _ in actual.values())
    assert estimate(config, PlanConfig(batch=2, group_size=1)).num_params == count


# Totals published with the checkpoints (model cards / safetensors metadata).
PUBLISHED = {
    "qwen2.5-0.5b": 0.494e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "qwen3-0.6b": 0.596e9,
    "qwen3-8b": 8.19e9,
    "llama-3-8b": 8.03e9,
    "llama-3-70b": 70.55e9,
    "llama-3.2-1b": 1.24e9,
    "llama-3.2-3b": 3.21e9,
    "qwen3-4b": 4.02e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_have_the_published_sizes(name):
    _, config = resolve_model(name)
    total = sum(math.prod(p.shape) for p in parameter_shapes(config))
    assert abs(total / PUBLISHED[name] - 1) < 0.005, total


def test_every_preset_builds():
    for name in PRESETS:
        assert resolve_model(name)[1].num_layers > 0


# ----------------------------------------------------------------------------- reference formulas

# Hand-written oracle of the sharded size: embed → fsdp, heads/kv_heads/mlp/vocab → tensor, when
# the mesh axis divides the dimension (else replicated); everything else whole.
AXIS = {"embed": 1, "heads": 2, "kv_heads": 2, "mlp": 2, "vocab": 2}


def reference_elements(config, mesh):
    return sharded_elements(parameter_shapes(config), mesh)


def sharded_elements(params, mesh):
    """Elements per device of the parameter shapes `params` on `mesh` (data, fsdp, tensor)."""
    total = 0
    for p in params:
        n = 1
        for size, name in zip(p.shape, p.names, strict=True):
            split = mesh[AXIS[name]] if name in AXIS else 1
            n *= size // split if size % split == 0 else size
        total += n
    return total


def test_memory_terms_follow_the_formulas():
    config = ModelConfig(
        family="llama",
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=96,
        num_layers=5,
        num_heads=8,
        num_kv_heads=4,
        head_dim=16,
    )
    d, f, t = 2, 4, 2
    for remat in ("none", "dots", "full"):
        plan = PlanConfig(
            mesh=(d, f, t), prompt_len=24, completion_len=40, batch=8, group_size=4,
            micro_batch=16, remat=remat, reference=True,
        )  # fmt: skip
        p = estimate(config, plan, "h100")
        w_dev = reference_elements(config, (d, f, t))
        w_t = reference_elements(config, (1, 1, t))
        L, D, F, H, K, Hd, V = 5, 64, 96, 8, 4, 16, 1000
        S, N, m = 64, 32, 16
        assert p.memory["params"] == w_dev * 4
        assert p.memory["optimizer"] == 2 * w_dev * 4
        assert p.memory["gradients"] == w_dev * 4
        # the reference and the gathered sampler weights are copies of the float32 parameters;
        # 16-sequence micro-batches of a 32-sequence update: MultiSteps' float32 accumulator
        assert p.memory["reference"] == w_dev * 4
        assert p.memory["sampler_weights"] == w_t * 4
        assert p.memory["accumulator"] == w_dev * 4
        assert p.memory["kv_cache"] == 2 * L * (N // (d * f)) * S * (K // t) * Hd * 2
        tokens = m // (d * f) * S
        Ht, Kt, Ft = H / t, K / t, F / t
        layer = tokens * (2 * (4 * D + 3 * (Ht + Kt) * Hd + 4 * Ft) + 6 * Ht * S)
        saved = {
            "none": L * layer,
            "dots": L * tokens * 2 * (3 * D + (Ht + 2 * Kt) * Hd + 2 * Ft) + layer,
            "full": L * tokens * 2 * D + layer,
        }[remat]
        logits = 2 * 4 * (m // (d * f)) * 40 * V / t  # completion positions only
        np.testing.assert_allclose(p.memory["activations"], saved + logits, rtol=1e-12)
        # attention in blocks of 8 queries: no layer keeps its [S, S] logits; one block and
        # the boolean mask live in the recomputed layer
        blocks = estimate(config, dataclasses.replace(plan, attention_chunk=8), "h100")
        rows = m // (d * f)
        dense = tokens * 2 * (4 * D + 3 * (Ht + Kt) * Hd + 4 * Ft)
        live = rows * (8 * 6 * Ht * S + S * S)
        saved = {
            "none": L * dense + live,
            "dots": L * tokens * 2 * (3 * D + (Ht + 2 * Kt) * Hd + 2 * Ft) + dense + live,
            "full": L * tokens * 2 * D + dense + live,
        }[remat]
        np.testing.assert_allclose(blocks.memory["activations"], saved + logits, rtol=1e-12)
        assert blocks.memory["activations"] < p.memory["activations"]
        training = (
            p.memory["params"] + p.memory["optimizer"] + p.memory["gradients"]
            + p.memory["reference"] + p.memory["layer_buffers"] + p.memory["activations"]
            + p.memory["accumulator"]
        )  # fmt: skip
        np.testing.assert_allclose(p.memory["training_peak"], training, rtol=1e-12)
        assert p.memory["peak"] == max(p.memory["training_peak"], p.memory["sampling_peak"])
    # what make_optimizer keeps: moments in the parameters' dtype, no accumulator for whole
    # updates, and on fsdp = 1 the sampler decodes with the parameters themselves
    bf16 = dataclasses.replace(plan, param_dtype="bfloat16", micro_batch=None, mesh=(1, 1, 2))
    p = estimate(config, bf16, "h100")
    w_dev = reference_elements(config, (1, 1, 2))
    assert p.memory["optimizer"] == 2 * w_dev * 2 and p.memory["accumulator"] == 0
    assert p.memory["sampler_weights"] == 0 and p.memory["reference"] == w_dev * 2
    what_if = estimate(config, dataclasses.replace(bf16, optimizer_dtype="float32"), "h100")
    assert what_if.memory["optimizer"] == 2 * w_dev * 4


def test_time_terms_follow_the_formulas():
    _, config = resolve_model("qwen2.5-7b")
    plan = PlanConfig(
        mesh=(2, 4, 1), prompt_len=256, completion_len=512, batch=16, group_size=4,
        micro_batch=16, epochs=2, reference=True, remat="full",
    )  # fmt: skip
    dev = DEVICES["h100"]
    p = estimate("qwen2.5-7b", plan, dev)
    L, H, Hd, K, V, D = 28, 28, 128, 4, 152064, 3584
    total = sum(math.prod(s.shape) for s in parameter_shapes(config))
    w_mm = total - V * D  # the embedding lookup is not a matmul (untied model)
    n, flops = 8, dev.peak_flops * plan.mfu
    P, T, S, N = 256, 512, 768, 64
    np.testing.assert_allclose(
        p.time["training_s"], 2 * N * S * (6 * w_mm + 12 * L * H * Hd * S) * (4 / 3) / (n * flops)
    )
    blocks = estimate("qwen2.5-7b", dataclasses.replace(plan, attention_chunk=128), dev)
    np.testing.assert_allclose(  # one more attention forward
        blocks.time["training_s"],
        2 * N * S * (6 * w_mm + 16 * L * H * Hd * S) * (4 / 3) / (n * flops),
    )
    passes = 2  # old policy (2 epochs reuse the rollout) + reference
    np.testing.assert_allclose(
        p.time["logprob_s"], passes * N * S * (2 * w_mm + 4 * L * H * Hd * S) / (n * flops)
    )
    from_sampler = estimate("qwen2.5-7b", dataclasses.replace(plan, old_logprobs="sampler"), dev)
    np.testing.assert_allclose(from_sampler.time["logprob_s"], p.time["logprob_s"] / 2)  # ref only
    on_policy = estimate("qwen2.5-7b", dataclasses.replace(plan, epochs=1, reference=False), dev)
    assert on_policy.time["logprob_s"] == 0.0
    two_updates = dataclasses.replace(plan, epochs=1, minibatches=2, reference=False)
    np.testing.assert_allclose(
        estimate("qwen2.5-7b", two_updates, dev).time["logprob_s"], p.time["logprob_s"] / 2
    )
    np.testing.assert_allclose(
        p.time["prefill_s"], 16 * P * (2 * w_mm + 4 * L * H * Hd * P) / (n * flops)
    )
    rows = N // 8
    step_bytes = total * 2 + 2 * L * rows * S * K * Hd * 2  # weights + the whole cache
    assert p.decode_bound == "memory"
    np.testing.assert_allclose(
        p.time["decode_s"], T * step_bytes / (dev.hbm_bandwidth * plan.bandwidth_efficiency)
    )
    # a huge batch per device makes the decode step compute-bound
    big = estimate("qwen2.5-7b", dataclasses.replace(plan, batch=4096, group_size=16), dev)
    assert big.decode_bound == "compute"


def test_memory_scales_with_the_mesh():
    base = PlanConfig(mesh=(1, 4, 1), batch=32, group_size=8, micro_batch=32)

    def mem(mesh, **kw):
        return estimate("qwen2.5-7b", dataclasses.replace(base, mesh=mesh, **kw), "h100").memory

    m4, m8 = mem((1, 4, 1)), mem((1, 8, 1))
    for key in ("params", "optimizer", "gradients"):
        np.testing.assert_allclose(m8[key] / m4[key], 0.5, rtol=1e-3)  # norms stay whole
    assert m8["sampler_weights"] == m4["sampler_weights"]  # gathered over fsdp for decoding
    t1, t2, t4 = mem((1, 4, 1)), mem((1, 4, 2)), mem((1, 4, 4))
    np.testing.assert_allclose(t2["sampler_weights"] / t1["sampler_weights"], 0.5, rtol=1e-3)
    assert t4["kv_cache"] == t1["kv_cache"] / 4  # 4 KV heads split over tensor=4
    # llama-3-70b: 8 KV heads do not split 16 ways, so every tensor rank keeps all of them
    plan70 = dataclasses.replace(base, mesh=(1, 4, 16))
    t16 = estimate("llama-3-70b", plan70, "h100")
    t1_70 = estimate("llama-3-70b", dataclasses.replace(plan70, mesh=(1, 4, 1)), "h100")
    assert t16.memory["kv_cache"] == t1_70.memory["kv_cache"]
    assert any("num_kv_heads=8 does not split over tensor=16" in n for n in t16.notes)
    d2 = mem((2, 4, 1))
    assert d2["params"] == m4["params"]
    assert d2["kv_cache"] == m4["kv_cache"] / 2 and d2["activations"] < m4["activations"]
    acts = [mem((1, 4, 1), remat=r)["activations"] for r in ("none", "dots", "full")]
    assert acts[0] > acts[1] > acts[2]
    chunked = mem((1, 4, 1), logits_chunk=1024)["activations"]
    assert chunked < m4["activations"]


def test_a_vocabulary_that_tensor_does_not_divide_counts_whole_logits():
    # qwen2.5-0.5b's 151,936 tokens split over tensor = 2; a vocabulary of 151,937 does not, so
    # each tensor rank keeps every logit column of the update (the rule table replicates it)
    from jaxrl_llm.plan.estimate import _activation_bytes

    even = resolve_model("qwen2.5-0.5b")[1]
    odd = dataclasses.replace(even, vocab_size=151937)
    plan = PlanConfig(mesh=(1, 1, 2), batch=8, group_size=4, completion_len=256)
    tokens = 32 * 256  # rows × scored positions
    assert _activation_bytes(even, plan, 32)["logits"] == 2 * 4 * tokens * 151936 / 2
    assert _activation_bytes(odd, plan, 32)["logits"] == 2 * 4 * tokens * 151937
    p = estimate(odd, plan, "h100")
    assert any("vocab_size=151937 does not split over tensor=2" in n for n in p.notes)


@pytest.mark.parametrize(
    ("mesh", "note"),
    [
        ((1, 1, 8), "num_heads=28 does not split over tensor=8: replicated"),
        ((1, 1, 3), "intermediate_size=18944 does not split over tensor=3: replicated"),
        ((1, 5, 1), "hidden_size=3584 does not split over fsdp=5: replicated"),
    ],
)
def test_dimensions_the_mesh_does_not_divide_are_replicated_as_at_run_time(mesh, note):
    """The rule table replicates them and the runtime runs such meshes (matching one device,
    checked on 8 simulated devices): they were refused as impossible."""
    p = estimate("qwen2.5-7b", PlanConfig(mesh=mesh, batch=40, group_size=8))
    assert note in p.notes
    split = estimate("qwen2.5-7b", PlanConfig(mesh=(1, 1, 4), batch=40, group_size=8))
    if mesh[2] > 1:  # replicated heads or MLP: more per device than a dividing tensor=4
        assert p.memory["activations"] > split.memory["activations"] / 2


@pytest.mark.parametrize(
    ("mesh", "message"),
    [
        ((3, 1, 1), r"batch=8 prompts do not split over data·fsdp = 3"),
        # N = 64 sequences would split 16 ways, but prefill splits the 8 prompts (the runner's
        # rule, runner.config): refused as `jaxrl-llm train` refuses it
        ((1, 16, 1), r"batch=8 prompts do not split over data·fsdp = 16"),
    ],
)
def test_impossible_meshes_are_rejected_by_name(mesh, message):
    with pytest.raises(ValueError, match=message):
        estimate("qwen2.5-7b", PlanConfig(mesh=mesh, batch=8, group_size=8))


def test_micro_batches_that_do_not_split_over_the_devices_are_counted_whole():
    """2 sequences per micro-batch on data·fsdp = 4 (the runner accepts it): not 0 rows per
    device (floor division once gave 0 bytes of activations), but all 2, with a note; the
    implicit micro-batch (N / minibatches) and the explicit one give the same estimate."""
    even = estimate("qwen3-0.6b", PlanConfig(mesh=(1, 4, 1), batch=4, group_size=2))
    implicit = PlanConfig(mesh=(1, 4, 1), batch=4, group_size=2, minibatches=4)
    uneven = estimate("qwen3-0.6b", implicit)
    explicit = estimate(
        "qwen3-0.6b", PlanConfig(mesh=(1, 4, 1), batch=4, group_size=2, micro_batch=2)
    )
    assert uneven.memory["activations"] == explicit.memory["activations"]
    # 2 rows per device either way: the 8 of one micro-batch split 4 ways, or 2 counted whole
    assert uneven.memory["activations"] == even.memory["activations"] > 0
    assert any("2 sequences does not split evenly over data·fsdp = 4" in n for n in uneven.notes)


def test_the_plan_command_refuses_a_top_below_one(capsys):
    from jaxrl_llm.cli import main

    with pytest.raises(SystemExit) as exit_info:  # argparse's type check, naming the flag
        main(["plan", "qwen3-0.6b", "--devices", "8", "--top", "0"])
    assert exit_info.value.code == 2
    assert "argument --top: must be a positive integer, got '0'" in capsys.readouterr().err


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="micro_batch=6 must divide the 64 sequences"):
        estimate("qwen2.5-7b", PlanConfig(mesh=(1, 4, 1), batch=8, group_size=8, micro_batch=6))
    with pytest.raises(ValueError, match="divide the 16 sequences of one optimizer update"):
        plan = PlanConfig(mesh=(1, 4, 1), batch=8, group_size=8, micro_batch=12, minibatches=4)
        estimate("qwen2.5-7b", plan)
    with pytest.raises(ValueError, match="minibatches=5 does not divide N = 64"):
        estimate("qwen2.5-7b", PlanConfig(batch=8, group_size=8, minibatches=5))
    with pytest.raises(ValueError, match="'qwen9' is neither a preset"):
        estimate("qwen9", PlanConfig())
    with pytest.raises(ValueError, match="unknown device 'tpu-v9'"):
        estimate("qwen3-0.6b", PlanConfig(), "tpu-v9")
    with pytest.raises(ValueError, match=r"PlanConfig\.mesh must be three positive ints"):
        PlanConfig(mesh=(1, 0, 1))
    with pytest.raises(ValueError, match=r"PlanConfig\.compute_dtype must be one of"):
        PlanConfig(compute_dtype="fp8")
    with pytest.raises(ValueError, match=r"PlanConfig\.remat must be"):
        PlanConfig(remat="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"PlanConfig.mfu must be in \(0, 1\]"):
        PlanConfig(mfu=1.5)
    with pytest.raises(ValueError, match=r"PlanConfig\.attention_chunk must be a positive int"):
        PlanConfig(attention_chunk=0)
    with pytest.raises(ValueError, match=r"PlanConfig\.old_logprobs must be 'forward' or"):
        PlanConfig(old_logprobs="rollout")  # type: ignore[arg-type]


def test_suggest_meshes_ranks_fitting_meshes_and_skips_impossible_ones():
    plan = PlanConfig(batch=32, group_size=8, micro_batch=32)
    plans = suggest_meshes("qwen2.5-7b", plan, "h100", 8)
    meshes = [p.config.mesh for p in plans]
    assert all(m[2] in (1, 2, 4) for m in meshes)  # 28 heads: tensor=8 would replicate them
    assert set(meshes) == {m for m in mesh_candidates(8) if m[2] in (1, 2, 4)}
    fits = [p.memory["peak"] <= 0.85 * p.device.hbm_bytes for p in plans]
    assert fits == sorted(fits, reverse=True)
    fitting = [
        p.iteration_s + p.time["train_comm_s"] for p, ok in zip(plans, fits, strict=True) if ok
    ]
    assert all(b >= a / 1.03 for a, b in itertools.pairwise(fitting))
    too_big = suggest_meshes("llama-3-70b", plan, "h100", 8)  # fits on no 8-GPU mesh
    peaks = [p.memory["peak"] for p in too_big]
    assert peaks == sorted(peaks) and not too_big[0].fits
    with pytest.raises(ValueError, match="no mesh of 3 devices"):
        suggest_meshes("qwen2.5-7b", PlanConfig(batch=8, group_size=8), "h100", 3)


def test_cli_reports_and_errors(capsys, tmp_path):
    assert main(["qwen2.5-7b", "--mesh", "1,8,1", "--micro-batch", "64", "--batch", "32"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-7b: 7.62 B parameters on 8 × H100 SXM" in out and "fits" in out
    assert "% sampling" in out
    assert (
        main(["llama-3-70b", "--devices", "64", "--device", "tpu-v5p", "--top", "2", "--json"]) == 0
    )
    plans = json.loads(capsys.readouterr().out)
    assert len(plans) == 2 and plans[0]["device"]["name"] == "TPU v5p"
    assert math.prod(plans[0]["config"]["mesh"]) == 64
    assert main(["qwen2.5-7b", "--mesh", "1,1,8"]) == 0
    assert "num_heads=28 does not split over tensor=8: replicated" in capsys.readouterr().out
    assert main(["qwen2.5-7b", "--mesh", "3,1,1", "--batch", "8"]) == 2
    assert "batch=8 prompts do not split over data·fsdp = 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["qwen2.5-7b", "--mesh", "1,8"])
    config = FAMILIES["qwen3"]
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    assert main([str(tmp_path), "--batch", "2", "--group-size", "2"]) == 0
    assert "0.00 B parameters" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("remat", "chunk"), [("none", None), ("dots", None), ("full", None), ("none", 32)]
)
def test_activation_estimate_is_close_to_xla_memory_analysis(remat, chunk):
    """The training-phase activations agree with what XLA allocates, within a factor of 2.

    float32 compute: the CPU backend computes bfloat16 in float32, which would double its side.
    """
    import jax
    import jax.numpy as jnp

    config = ModelConfig(
        family="llama",
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        num_layers=3,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
    )
    m, S = 4, 128
    abstract = nnx.eval_shape(
        lambda: Decoder(config, remat=remat, attention_chunk=chunk, rngs=nnx.Rngs(0))
    )
    graphdef, state = nnx.split(abstract)

    def loss(state, tokens):
        logits = nnx.merge(graphdef, state)(tokens, jnp.broadcast_to(jnp.arange(S), tokens.shape))
        return jnp.mean(jax.nn.logsumexp(logits, -1))

    tokens = jax.ShapeDtypeStruct((m, S), jnp.int32)
    xla = jax.jit(jax.grad(loss)).lower(state, tokens).compile().memory_analysis()
    plan = PlanConfig(
        prompt_len=1, completion_len=S - 1, batch=m, group_size=1, remat=remat,
        compute_dtype="float32", attention_chunk=chunk,
    )  # fmt: skip
    p = estimate(config, plan, "h100")
    ratio = (p.memory["activations"] + p.memory["layer_buffers"]) / xla.temp_size_in_bytes
    assert 0.5 < ratio < 2.0, (remat, ratio)


def test_lora_shapes_are_the_adapters_of_add_lora():
    from jaxrl_llm.models import LoRAConfig, add_lora
    from jaxrl_llm.plan.shapes import lora_shapes

    config = FAMILIES["qwen3"]

    for dora in (False, True):  # DoRA adds a magnitude per output feature

        def adapted(dora=dora):
            lora = LoRAConfig(rank=3, use_dora=dora)
            return add_lora(Decoder(config, rngs=nnx.Rngs(0)), lora, rngs=nnx.Rngs(1))

        actual = {path: v for path, v in model_shapes(adapted).items() if "_lora_" in path}
        assert {p.path: (p.shape, p.names) for p in lora_shapes(config, 3, dora)} == actual
        assert any(path.endswith("_lora_m") for path in actual) == dora


def test_lora_memory_and_time_follow_the_formulas():
    """Rank-4 adapters on (2, 4, 2): the optimizer, gradients and reference hold only the
    adapters (their shards counted by hand from the rule table: embed over fsdp, heads, KV
    heads and MLP over tensor, the rank axis whole); the update skips the base's weight
    gradients (4·W_mm instead of 6·W_mm)."""
    config = ModelConfig(
        family="llama", vocab_size=1000, hidden_size=64, intermediate_size=96, num_layers=5,
        num_heads=8, num_kv_heads=4, head_dim=16,
    )  # fmt: skip
    d, f, t, r = 2, 4, 2, 4
    L, D, F, H, K, Hd = 5, 64, 96, 8, 4, 16

    def adapters(f, t):
        q = D // f * r + r * H // t * Hd
        kv = 2 * (D // f * r + r * K // t * Hd)
        o = H // t * Hd * r + r * D // f
        mlp = 2 * (D // f * r + r * F // t) + (F // t * r + r * D // f)
        return L * (q + kv + o + mlp)

    plan = PlanConfig(
        mesh=(d, f, t), prompt_len=24, completion_len=40, batch=8, group_size=4,
        micro_batch=16, reference=True, lora_rank=r,
    )  # fmt: skip
    full = estimate(config, dataclasses.replace(plan, lora_rank=None), "h100")
    p = estimate(config, plan, "h100")
    w_dev, w_t = reference_elements(config, (d, f, t)), reference_elements(config, (1, 1, t))
    a_dev, a_t = adapters(f, t), adapters(1, t)
    assert p.memory["params"] == (w_dev + a_dev) * 4
    assert p.memory["optimizer"] == 2 * a_dev * 4
    assert p.memory["gradients"] == a_dev * 4
    assert p.memory["reference"] == a_dev * 4  # a copy of the (float32) adapters
    assert p.memory["sampler_weights"] == (w_t + a_t) * 4
    assert p.memory["accumulator"] == a_dev * 4
    assert p.memory["training_peak"] < full.memory["training_peak"]
    w_mm = sum(math.prod(s.shape) for s in parameter_shapes(config)) - 1000 * D
    attn = 3 * 4 * L * H * Hd * 64  # three attention passes of 4·L·H·Hd FLOPs per position
    np.testing.assert_allclose(
        p.time["training_s"] / full.time["training_s"], (4 * w_mm + attn) / (6 * w_mm + attn)
    )


@pytest.mark.parametrize("name", ["llama_bias_untied", "qwen2_tied", "gemma2"])
def test_critic_shapes_are_the_value_models_parameters(name):
    from jaxrl_llm.models import ValueModel

    config = FAMILIES[name]
    actual = model_shapes(lambda: ValueModel(config, rngs=nnx.Rngs(0)))
    assert {p.path: (p.shape, p.names) for p in critic_shapes(config)} == actual


def test_critic_memory_and_time_follow_the_formulas():
    """A separate critic on (2, 4, 2): the policy's weights less the LM head plus a [D, 1]
    value head (counted by hand from the rule table), its AdamW moments and gradients, the
    saved activations of its forward, one more forward for the rollout's values and its
    6·C_mm (LoRA: 4·C_mm, only the adapters and the head trained) in the update."""
    config = ModelConfig(
        family="llama", vocab_size=1000, hidden_size=64, intermediate_size=96, num_layers=5,
        num_heads=8, num_kv_heads=4, head_dim=16,
    )  # fmt: skip
    d, f, t, r = 2, 4, 2, 4
    L, D, F, H, K, Hd, V = 5, 64, 96, 8, 4, 16, 1000
    plan = PlanConfig(
        mesh=(d, f, t), prompt_len=24, completion_len=40, batch=8, group_size=4, micro_batch=16,
    )  # fmt: skip
    alone = estimate(config, plan, "h100")
    p = estimate(config, dataclasses.replace(plan, critic=True), "h100")
    c_dev = reference_elements(config, (d, f, t)) - D // f * V // t + D // f
    assert p.memory["critic_params"] == c_dev * 4
    assert p.memory["critic_optimizer"] == 2 * c_dev * 4
    assert p.memory["critic_gradients"] == c_dev * 4
    saved = p.memory["critic_activations"]
    assert 0 < saved < p.memory["activations"]  # the policy's also holds logits
    # with micro-batches below the update the critic's gradients accumulate too (float32)
    critic = p.memory["critic_params"] + p.memory["critic_optimizer"] + c_dev * 4
    assert p.memory["accumulator"] - alone.memory["accumulator"] == c_dev * 4
    np.testing.assert_allclose(
        p.memory["training_peak"] - alone.memory["training_peak"],
        critic + p.memory["critic_gradients"] + saved,
    )
    np.testing.assert_allclose(p.memory["sampling_peak"] - alone.memory["sampling_peak"], critic)
    w_mm = sum(math.prod(s.shape) for s in parameter_shapes(config)) - V * D
    c_mm = w_mm - D * V + D  # no LM head; the value head
    attn = 3 * 4 * L * H * Hd * 64  # three attention passes per position, per model
    np.testing.assert_allclose(
        p.time["training_s"] / alone.time["training_s"],
        (6 * w_mm + attn + 6 * c_mm + attn) / (6 * w_mm + attn),
    )
    tokens, fwd = 32 * 64, 4 * L * H * Hd * 64
    flops = DEVICES["h100"].peak_flops * plan.mfu * d * f * t
    np.testing.assert_allclose(
        p.time["logprob_s"] - alone.time["logprob_s"], tokens * (2 * c_mm + fwd) / flops
    )

    lora = estimate(config, dataclasses.replace(plan, critic=True, critic_lora_rank=r), "h100")
    adapters = L * (
        (D // f * r + r * H // t * Hd)
        + 2 * (D // f * r + r * K // t * Hd)
        + (H // t * Hd * r + r * D // f)
        + 2 * (D // f * r + r * F // t)
        + (F // t * r + r * D // f)
    )
    assert lora.memory["critic_params"] == (c_dev + adapters) * 4
    assert lora.memory["critic_optimizer"] == 2 * (adapters + D // f) * 4
    assert lora.memory["critic_gradients"] == (adapters + D // f) * 4
    lora_mm = c_mm + sum(math.prod(s.shape) for s in lora_shapes(config, r))
    np.testing.assert_allclose(
        lora.time["training_s"] / alone.time["training_s"],
        (6 * w_mm + attn + 4 * lora_mm + attn) / (6 * w_mm + attn),
    )
    with pytest.raises(ValueError, match="critic_lora_rank needs critic=True"):
        PlanConfig(critic_lora_rank=4)
