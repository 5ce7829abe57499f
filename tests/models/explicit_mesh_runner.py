"""Run by `test_explicit_mesh.py` with 8 simulated CPU devices: `python -m ...explicit_mesh_runner`.

For each Explicit-axes mesh `(data, fsdp, tensor)` in `MESHES`, the weights are placed by
`jaxrl_llm.parallel.param_shardings` (FSDP over `fsdp` on `embed`, tensor-parallel over
`tensor` on heads / KV heads / MLP / vocabulary) and one jitted program per model checks
against the same program run without a mesh (float32, tolerance `TOL`):

- the decoder's full-forward logits (typed `[N@batch, S, V@tensor]`);
- the training path of `jaxrl_llm.train.logprobs.completion_logprobs`: completion hidden
  states, the vocabulary projection in position chunks, `losses.token_logprobs` and
  `losses.entropy_from_logits` on vocabulary-split logits, and the `jax.grad` of a policy-style
  loss of them (every gradient keeps its parameter's sharding); on one device the log-probs
  also equal a float64 NumPy log-softmax of the full logits;
- cached decoding (a prefill then one token per call) against the full forward;
- a `ValueModel`'s values;
- the compiled sampler: greedy tokens identical, log-probs within `TOL` (and on one mesh a
  top-k sampling run, whose tokens also must be identical);
- the big matrices are really split: per-device bytes = total / (product of their mesh axes).

The decoder is Gemma 3-style (tied embeddings, QK-norm, sandwich norms, one sliding and one full
layer, soft-capping, attention biases) and attends in blocks of 3 queries (`attention_chunk`;
its cached decoding and the value model attend whole); the sampler runs a Qwen3-style untied model, the value
model a Llama one with fused attention (`Decoder(fused_attention=True)`). Dimensions divide the mesh axes, except the 2 KV heads on `tensor=4`, which
the rules replicate (attention then runs with the query heads gathered).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.models import Decoder, ModelConfig, ValueModel, positions_from_mask
from jaxrl_llm.parallel import param_shardings
from jaxrl_llm.sampler import SamplingConfig, jit_sample_tokens
from jaxrl_llm.train.batch import SequenceBatch
from jaxrl_llm.train.logprobs import completion_logprobs
from sharding import MeshConfig, batch_shardings, make_mesh

# data, FSDP and tensor parallelism at once; FSDP-heavy; tensor = 4 does not divide the 2 KV heads
MESHES = [(2, 2, 2), (1, 4, 2), (1, 2, 4)]
TOL = 1e-5  # float32 logits, gradients and log-probs: sharded vs single device
N, S, PREFILL = 8, 7, 5
T, TAU, CHUNK = 3, 0.7, 2  # completion length (prompt P = S - T), temperature, positions/chunk
DIMS = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
)
BIG = {  # parameter path -> its mesh axes (the product divides its size)
    ("embed",): ("fsdp", "tensor"),
    ("layers", "attn", "q"): ("fsdp", "tensor"),
    ("layers", "attn", "o"): ("fsdp", "tensor"),
    ("layers", "mlp", "gate"): ("fsdp", "tensor"),
    ("layers", "mlp", "up"): ("fsdp", "tensor"),
    ("layers", "mlp", "down"): ("fsdp", "tensor"),
}


def redraw(model: nnx.Module, seed: int, std: float = 0.4) -> tuple[nnx.GraphDef, nnx.State]:
    """Split `model` and redraw every parameter (biases and norms too) with `std`."""
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [
        std * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    return graphdef, jax.tree.unflatten(treedef, leaves)


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, DIMS["vocab_size"], (N, S)).astype(np.int32)
    pad = rng.integers(0, PREFILL - 1, N)  # left padding inside the prefill part
    mask = (np.arange(S)[None, :] >= pad[:, None]).astype(np.int32)
    return {
        "tokens": tokens,
        "mask": mask,
        "positions": np.asarray(positions_from_mask(jnp.asarray(mask))),
        "completion_mask": (rng.uniform(size=(N, T)) < 0.8).astype(np.int32),
        "token_weights": rng.normal(size=(N, T)).astype(np.float32),  # advantage-like
    }


def model_checks(graphdef, state, value_graphdef, value_state, batch):
    """Logits, training log-probs and their grads, cached-decode logits, values: one program."""
    tokens, mask, positions = batch["tokens"], batch["mask"], batch["positions"]
    model = nnx.merge(graphdef, state)
    logits = model(tokens, positions, attention_mask=mask)
    seq = SequenceBatch(tokens, mask, batch["completion_mask"])

    def loss(s):  # -Σ w·lp - 0.1·H over the completion mask, as a policy loss would
        lp, entropy, _ = completion_logprobs(
            nnx.merge(graphdef, s), seq, temperature=TAU, chunk_size=CHUNK, with_entropy=True
        )
        per_token = -(batch["token_weights"] * lp + 0.1 * entropy)
        cm = seq.completion_mask
        return jnp.sum(per_token * cm) / jnp.maximum(jnp.sum(cm), 1), (lp, entropy)

    (_, (lp, entropy)), grads = jax.value_and_grad(loss, has_aux=True)(state)

    cache = model.init_cache(batch=N, max_len=S)
    prefill, cache = model.decode(
        tokens[:, :PREFILL], positions[:, :PREFILL], cache, attention_mask=mask[:, :PREFILL]
    )

    def step(cache, column):  # one token per call; the columns are scanned
        token, position, valid = column
        logits, cache = model.decode(
            token[:, None], position[:, None], cache, attention_mask=valid[:, None]
        )
        return cache, logits[:, 0]

    rest = jax.tree.map(lambda x: x[:, PREFILL:].T, (tokens, positions, mask))
    _, steps = jax.lax.scan(step, cache, rest)  # [S - PREFILL, N, V]
    decoded = jnp.concatenate([prefill, jnp.swapaxes(steps, 0, 1)], axis=1)
    values = nnx.merge(value_graphdef, value_state)(tokens, positions, attention_mask=mask)
    return logits, (lp, entropy), grads, decoded, values


def close(actual, expected, what: str) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=TOL, err_msg=what)


def put_rows(tree, mesh):
    """Rows over the batch axes where they divide them, else replicated (the model splits)."""

    def one(x):
        if x.shape[0] % (mesh.shape["data"] * mesh.shape["fsdp"]):
            return jax.device_put(x, NamedSharding(mesh, PartitionSpec()))
        return jax.device_put(x, batch_shardings(x, mesh))

    return jax.tree.map(one, tree)


def check_split(state, mesh) -> None:
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    flat = dict(nnx.to_flat_state(state))
    for path, axes in BIG.items():
        value = flat[path].get_value()
        per_device = value.addressable_shards[0].data.nbytes
        factor = int(np.prod([sizes[a] for a in axes]))
        assert per_device * factor == value.nbytes, (path, per_device, value.nbytes, sizes)
    k = flat[("layers", "attn", "k")].get_value()  # KV heads: over tensor only when it divides
    kv_factor = sizes["fsdp"] * (
        sizes["tensor"] if DIMS["num_kv_heads"] % sizes["tensor"] == 0 else 1
    )
    assert k.addressable_shards[0].data.nbytes * kv_factor == k.nbytes, (k.sharding, sizes)


def place(state, mesh):
    return jax.device_put(state, param_shardings(state, mesh))


def build() -> dict:
    """The three models (split, weights redrawn), the batch, prompts and sampler configs."""
    cfg = ModelConfig(
        family="gemma3_text",
        tie_embeddings=True,
        attention_bias=True,
        layer_types=("sliding_attention", "full_attention"),
        sliding_window=3,
        final_logit_softcap=8.0,
        **DIMS,
    )
    value_cfg = dataclasses.replace(cfg, family="llama", layer_types=(), sliding_window=None)
    sampler_cfg = dataclasses.replace(value_cfg, family="qwen3", attention_bias=False)
    batch = {k: jnp.asarray(v) for k, v in inputs().items()}
    loop = dict(max_new_tokens=6, num_samples=2, steps_per_loop=1, layer_unroll=1)
    return {
        "decoder": redraw(Decoder(cfg, attention_chunk=3, rngs=nnx.Rngs(0)), 1),
        "value": redraw(ValueModel(value_cfg, fused_attention=True, rngs=nnx.Rngs(1)), 2),
        "sampler": redraw(Decoder(sampler_cfg, rngs=nnx.Rngs(2)), 3, std=0.5),
        "batch": batch,
        "prompts": (batch["tokens"][::2, :5], batch["mask"][::2, :5]),  # B = 4 prompts
        "greedy": SamplingConfig(temperature=0.0, stop_tokens=(), **loop),
        # sampled (uniforms split by row), filtered (per-shard top-k), weights gathered per step
        "top_k": SamplingConfig(
            temperature=0.9, top_k=5, stop_tokens=(0,), gather_weights=False, **loop
        ),
    }


CHECKS = jax.jit(model_checks, static_argnums=(0, 2))


def run_checks(m: dict, mesh=None):
    (graphdef, state), (value_graphdef, value_state) = m["decoder"], m["value"]
    batch = m["batch"]
    if mesh is None:
        return CHECKS(graphdef, state, value_graphdef, value_state, batch)
    state, value_state = place(state, mesh), place(value_state, mesh)
    check_split(state, mesh)
    with jax.set_mesh(mesh):
        out = CHECKS(graphdef, state, value_graphdef, value_state, put_rows(batch, mesh))
    grads = out[2]
    for (path, g), (_, p) in zip(nnx.to_flat_state(grads), nnx.to_flat_state(state), strict=True):
        assert g.get_value().sharding == p.get_value().sharding, (path, g.get_value().sharding)
    return out


def reference_logprobs(logits: np.ndarray, batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """float64 `log_softmax(z/τ)[y]` and entropy of the completion tokens, 0 outside the mask.

    Completion token `t` (absolute position `P + t`, `P = S - T`) is scored by the logits at
    `P + t - 1`.
    """
    P = S - T
    z = np.asarray(logits, np.float64)[:, P - 1 : P - 1 + T] / TAU
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    targets = np.asarray(batch["tokens"])[:, P:]
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    entropy = -(np.exp(logp) * logp).sum(axis=-1)
    valid = np.asarray(batch["completion_mask"]) > 0
    return np.where(valid, picked, 0.0), np.where(valid, entropy, 0.0)


def run_sampler(m: dict, config: SamplingConfig, mesh=None):
    graphdef, state = m["sampler"]
    prompts, mask = m["prompts"]
    key = jax.random.key(7)
    if mesh is None:
        return jit_sample_tokens(graphdef, state, prompts, mask, key, config=config)
    state = place(state, mesh)
    check_split(state, mesh)
    with jax.set_mesh(mesh):
        return jit_sample_tokens(
            graphdef, state, put_rows(prompts, mesh), put_rows(mask, mesh), key, config=config
        )


def main() -> None:
    if jax.device_count() != 8:
        raise SystemExit(f"expected 8 devices, got {jax.device_count()}")
    m = build()
    logits, train_lp, grads, decoded, values = run_checks(m)
    valid = np.asarray(m["batch"]["mask"], bool)
    assert np.isfinite(np.asarray(logits)).all()
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads)), "a zero gradient"
    close(np.asarray(decoded)[valid], np.asarray(logits)[valid], "single device: cached decode")
    for got, want, what in zip(
        train_lp, reference_logprobs(logits, m["batch"]), ("lp", "H"), strict=True
    ):
        close(got, want, f"single device: training {what} vs float64 NumPy")
    single_rollouts = {c: run_sampler(m, m[c]) for c in ("greedy", "top_k")}

    rows = ("data", "fsdp")
    for shape in MESHES:
        mesh = make_mesh(MeshConfig(data=shape[0], fsdp=shape[1], tensor=shape[2]))
        name = f"mesh {shape}"
        out_logits, out_lp, out_grads, out_decoded, out_values = run_checks(m, mesh)
        want_spec = PartitionSpec(rows, None, "tensor")  # tensor divides V = 32
        assert out_logits.sharding.spec == want_spec, (name, out_logits.sharding)
        close(out_logits, logits, f"{name}: logits")
        for got, want, what in zip(out_lp, train_lp, ("log-probs", "entropies"), strict=True):
            assert got.sharding.spec[0] == rows, (name, what, got.sharding)
            close(got, want, f"{name}: training {what}")
        for (path, g), (_, want) in zip(
            nnx.to_flat_state(out_grads), nnx.to_flat_state(grads), strict=True
        ):
            close(g.get_value(), want.get_value(), f"{name}: grad {path}")
        close(np.asarray(out_decoded)[valid], np.asarray(logits)[valid], f"{name}: cached decode")
        # real positions: on (1, 2, 4) the critic keeps the default attention (2 KV heads do
        # not split 4 ways), whose padding positions hold other (never read) values
        close(np.asarray(out_values)[valid], np.asarray(values)[valid], f"{name}: values")
        for c in ("greedy", "top_k") if shape == (2, 2, 2) else ("greedy",):
            got, want = run_sampler(m, m[c], mesh), single_rollouts[c]
            np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens), name)
            np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(want.lengths), name)
            close(got.logprobs, want.logprobs, f"{name}: {c} log-probs")
            close(got.sampling_logprobs, want.sampling_logprobs, f"{name}: {c} sampling log-probs")
            assert got.tokens.sharding.spec[0] == rows, (name, got.tokens.sharding)
        print(f"{name}: ok")
    # one program per mesh and model: nothing retraced within a mesh
    programs = (CHECKS._cache_size(), jit_sample_tokens.jitted._cache_size())
    assert programs == (1 + len(MESHES), 2 + len(MESHES) + 1), programs
    print("explicit meshes: ok")


if __name__ == "__main__":
    main()
