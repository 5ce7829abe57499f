"""The planner's formulas and options, pinned term by term (mutation testing, 2026-12-08):
collectives, remat, decode bound, layer buffers and workspaces, dtype sizes, mesh ranking,
validation, the CLI's options and the report's rows."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from jaxrl_llm.models import ModelConfig
from jaxrl_llm.plan import (
    DEVICES,
    PlanConfig,
    estimate,
    format_plan,
    main,
    mesh_candidates,
    parameter_shapes,
    plan_to_dict,
    resolve_model,
    suggest_meshes,
)
from jaxrl_llm.plan.shapes import critic_shapes
from tests.jaxrl_llm.test_plan import sharded_elements as elements

CONFIG = ModelConfig(
    family="llama", vocab_size=1000, hidden_size=64, intermediate_size=96, num_layers=5,
    num_heads=8, num_kv_heads=4, head_dim=16,
)  # fmt: skip
L, D, F, H, K, Hd, V = 5, 64, 96, 8, 4, 16, 1000


def test_collectives_follow_the_formulas_and_the_links_they_cross():
    d, f, t = 2, 4, 2
    plan = PlanConfig(
        mesh=(d, f, t), prompt_len=24, completion_len=40, batch=8, group_size=4,
        micro_batch=16, epochs=2, remat="full",
    )  # fmt: skip
    dev = DEVICES["h100"]  # NVLink inside 8 GPUs: data (span 16) leaves the node, fsdp (8) does not
    fast, slow = dev.interconnect_bandwidth, dev.network_bandwidth
    S, steps, rows, g = 64, 2 * 32 // 16, 16 // (d * f), 3  # 3 gathers with full remat
    for critic in (False, True):
        p = estimate(CONFIG, dataclasses.replace(plan, critic=critic), dev)
        w_t = elements(parameter_shapes(CONFIG), (1, 1, t))
        w_dev = elements(parameter_shapes(CONFIG), (d, f, t))
        c_t = elements(critic_shapes(CONFIG), (1, 1, t)) if critic else 0
        c_dev = elements(critic_shapes(CONFIG), (d, f, t)) if critic else 0
        models = 2 if critic else 1
        fsdp = (g * (w_t + c_t) * 2 + (w_t + c_t) * 4) * (f - 1) / f
        data = 2 * (w_dev + c_dev) * 4 * (d - 1) / d
        tensor = models * g * 2 * L * 2 * (t - 1) / t * rows * S * D * 2
        expected = steps * (fsdp / fast + data / slow + tensor / fast)
        np.testing.assert_allclose(p.time["train_comm_s"], expected, rtol=1e-12)


def test_remat_dots_does_not_recompute_the_forward():
    plan = PlanConfig(mesh=(1, 2, 2), prompt_len=24, completion_len=40, batch=8, group_size=4)
    dev = DEVICES["h100"]
    w_mm = sum(math.prod(s.shape) for s in parameter_shapes(CONFIG)) - V * D
    N, S, n = 32, 64, 4
    for remat, factor in (("none", 1.0), ("dots", 1.0), ("full", 4 / 3)):
        p = estimate(CONFIG, dataclasses.replace(plan, remat=remat), dev)
        expected = N * S * (6 * w_mm + 12 * L * H * Hd * S) * factor / (n * dev.peak_flops * 0.4)
        np.testing.assert_allclose(p.time["training_s"], expected, rtol=1e-12)


def test_a_compute_bound_decode_step_splits_its_flops_over_tensor():
    plan = PlanConfig(mesh=(2, 2, 2), prompt_len=256, completion_len=512, batch=4096, group_size=16)
    dev = DEVICES["h100"]
    p = estimate("qwen2.5-7b", plan, dev)
    assert p.decode_bound == "compute"
    _, config = resolve_model("qwen2.5-7b")
    L, H, Hd, V, D = 28, 28, 128, 152064, 3584
    w_mm = sum(math.prod(s.shape) for s in parameter_shapes(config)) - V * D
    rows, S, t = 4096 * 16 // 4, 768, 2
    flops = rows * (2 * w_mm / t + 4 * L * H * Hd / t * S)
    np.testing.assert_allclose(p.time["decode_step_s"], flops / (dev.peak_flops * 0.4), rtol=1e-12)


def test_layer_buffers_and_the_sampling_workspace_follow_the_formulas():
    d, f, t = 1, 2, 2
    layers = [p for p in parameter_shapes(CONFIG) if p.path.startswith("layers.")]
    layer_t = elements(layers, (1, 1, t)) / L
    Ht, Kt, Ft = H / t, K / t, F / t
    # long prompts, one sample each: the prefill is the larger workspace
    for prompt_len, group_size in ((512, 1), (8, 16)):
        plan = PlanConfig(
            mesh=(d, f, t), prompt_len=prompt_len, completion_len=40, batch=8,
            group_size=group_size,
        )  # fmt: skip
        p = estimate(CONFIG, plan, "h100")
        assert p.memory["layer_buffers"] == 2 * layer_t * 2  # bfloat16 compute, fp32 params
        P, S, rows = prompt_len, prompt_len + 40, 8 * group_size // (d * f)
        prefill = 8 // (d * f) * P * (2 * (D + (Ht + 2 * Kt) * Hd + 2 * Ft) + 4 * Ht * P)
        decode = rows * (2 * 4 * V / t + 4 * Ht * S)
        assert (prefill > decode) == (group_size == 1)
        np.testing.assert_allclose(p.memory["sampling_workspace"], max(prefill, decode), rtol=1e-12)
        m = p.memory
        resident = m["params"] + m["optimizer"] + m["reference"] + m["accumulator"]
        np.testing.assert_allclose(
            m["sampling_peak"],
            resident + m["sampler_weights"] + m["kv_cache"] + m["sampling_workspace"],
            rtol=1e-12,
        )


def test_float16_counts_two_bytes():
    plan = PlanConfig(mesh=(1, 1, 1), batch=4, group_size=2, prompt_len=8, completion_len=8)
    bf16 = estimate(CONFIG, plan, "h100").memory
    fp16 = estimate(CONFIG, dataclasses.replace(plan, compute_dtype="float16"), "h100").memory
    assert fp16 == bf16


def test_a_logits_chunk_above_the_scored_tokens_changes_nothing():
    plan = PlanConfig(mesh=(1, 2, 1), batch=4, group_size=2, prompt_len=8, completion_len=8)
    whole = estimate(CONFIG, plan, "h100").memory["activations"]
    big = estimate(CONFIG, dataclasses.replace(plan, logits_chunk=10**6), "h100")
    assert big.memory["activations"] == whole


def test_the_critic_keeps_only_its_saved_activations():
    plan = PlanConfig(
        mesh=(1, 2, 2), prompt_len=24, completion_len=40, batch=8, group_size=4, critic=True
    )
    p = estimate(CONFIG, plan, "h100")
    rows, S = 32 // 2, 64
    assert p.memory["critic_activations"] == L * rows * S * 2 * D  # full remat: layer inputs


def test_suggest_meshes_keeps_a_headroom_of_15_percent_by_default():
    plan = PlanConfig(batch=16, group_size=4)
    plans = suggest_meshes("qwen2.5-7b", plan, "h100", 8, margin=1.0)
    best = plans[0]  # the fastest fitting mesh on a roomy device; now give it 90% of the HBM
    tight = dataclasses.replace(DEVICES["h100"], hbm_bytes=best.memory["peak"] / 0.9)
    default = [p.config.mesh for p in suggest_meshes("qwen2.5-7b", plan, tight, 8)]
    assert default == [
        p.config.mesh for p in suggest_meshes("qwen2.5-7b", plan, tight, 8, margin=0.85)
    ]
    assert default != [
        p.config.mesh for p in suggest_meshes("qwen2.5-7b", plan, tight, 8, margin=0.95)
    ]


def test_within_3_percent_the_lower_peak_ranks_first():
    plans = suggest_meshes("qwen2.5-7b", PlanConfig(batch=16, group_size=4), "h100", 8)
    meshes = [p.config.mesh for p in plans]
    fast, lean = plans[meshes.index((2, 1, 4))], plans[meshes.index((1, 2, 4))]
    t_fast = fast.iteration_s + fast.time["train_comm_s"]
    t_lean = lean.iteration_s + lean.time["train_comm_s"]
    assert t_fast < t_lean < 1.03 * t_fast and lean.memory["peak"] < fast.memory["peak"]
    assert meshes.index((1, 2, 4)) < meshes.index((2, 1, 4))


def test_more_bad_inputs_are_named():
    with pytest.raises(ValueError, match="dora needs LoRA adapters"):
        PlanConfig(dora=True)
    with pytest.raises(ValueError, match=r"bandwidth_efficiency must be in \(0, 1\]"):
        PlanConfig(bandwidth_efficiency=1.5)
    with pytest.raises(ValueError, match="mesh must be three positive ints"):
        PlanConfig(mesh=(1.0, 2, 1))
    with pytest.raises(ValueError, match="num_devices must be a positive int"):
        mesh_candidates(True)
    with pytest.raises(ValueError, match=r"margin must be in \(0, 1\]"):
        suggest_meshes("qwen3-0.6b", PlanConfig(batch=8, group_size=4), "h100", 8, margin=1.5)


def test_cli_passes_every_option_to_the_plan(capsys):
    argv = [
        "qwen3-0.6b", "--mesh", "1x2x1", "--batch", "4", "--group-size", "2", "--lora-rank", "4",
        "--dora", "--critic", "--attention-chunk", "64", "--old-logprobs", "sampler",
        "--optimizer-dtype", "float32", "--logits-chunk", "128", "--reference", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    config = json.loads(capsys.readouterr().out)[0]["config"]
    expected = {
        "mesh": [1, 2, 1], "lora_rank": 4, "dora": True, "critic": True, "attention_chunk": 64,
        "old_logprobs": "sampler", "optimizer_dtype": "float32", "logits_chunk": 128,
        "reference": True,
    }  # fmt: skip
    assert {k: config[k] for k in expected} == expected


def test_report_rows_and_labels():
    plan = PlanConfig(batch=4, group_size=2, lora_rank=4, dora=True)
    text = format_plan(estimate("qwen3-0.6b", plan, "h100"))
    assert "DoRA rank 4 on every projection" in text and "reference policy" not in text
    text = format_plan(estimate("qwen3-0.6b", dataclasses.replace(plan, reference=True), "h100"))
    assert "reference policy (float32)" in text
    big = estimate("llama-3-70b", PlanConfig(batch=4, group_size=2), "h100")
    assert plan_to_dict(big)["fits"] is False and "DOES NOT FIT" in format_plan(big)


def test_resolve_model_names(tmp_path, monkeypatch):
    assert resolve_model("Qwen3-0.6B")[0] == "qwen3-0.6b"
    cfg = resolve_model("qwen3-0.6b")[1]
    assert resolve_model(cfg)[0] == "qwen3"
    # a checkpoint's config.json is named after its directory (reading it is not the point here:
    # the HF mapping's import costs seconds)
    monkeypatch.setattr(ModelConfig, "from_json_file", classmethod(lambda cls, path: cfg))
    (tmp_path / "my-model").mkdir()
    path = tmp_path / "my-model" / "config.json"
    path.write_text("{}")
    assert resolve_model(path) == ("my-model", cfg)
    assert resolve_model(path.parent) == ("my-model", cfg)


def test_heads_and_vocabulary_that_tensor_does_not_divide_count_whole():
    # tensor = 3 divides the MLP (96) but not the 8 query heads, the 4 KV heads or 1000 tokens
    plan = PlanConfig(
        mesh=(1, 1, 3), prompt_len=24, completion_len=40, batch=2, group_size=2, remat="none"
    )
    p = estimate(CONFIG, plan, "h100")
    tokens, S = 4 * 64, 64
    Ht, Kt, Ft = H, K, F / 3
    layer = tokens * (2 * (4 * D + 3 * (Ht + Kt) * Hd + 4 * Ft) + 6 * Ht * S)
    logits = 2 * 4 * 4 * 40 * V
    np.testing.assert_allclose(p.memory["activations"], L * layer + logits, rtol=1e-12)


def test_bools_are_not_counts_and_numpy_integers_are():
    with pytest.raises(ValueError, match="mesh must be three positive ints"):
        PlanConfig(mesh=(True, 2, 1))
    with pytest.raises(ValueError, match="micro_batch must be a positive int or None"):
        PlanConfig(micro_batch=True)
    plan = PlanConfig(mesh=np.array([1, 2, 1]), batch=np.int64(4), micro_batch=np.int32(2))
    assert plan.mesh == (1, 2, 1) and type(plan.mesh[0]) is int
    assert type(plan.batch) is int and type(plan.micro_batch) is int
