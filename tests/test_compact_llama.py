"""The compact Llama forward: the same logits as transformers on the same weights, a drop-in for the loop as
draft and as target (greedy output equal to the target's: here, and tests/test_draft_vocab.py runs the
draft beside the transformers path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from runner.models.compact_llama import CompactLlama, supports
from runner.models.draft_vocab import SubsetHeadDraft
from runner.run import runtime_draft, runtime_target
from runner.decoding.speculative import generate_plain, generate_speculative
from tests.tinymodels import layer_skip_draft, tiny_llama, tiny_llama_config

torch.set_num_threads(1)
V = 320


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, seed=0, hidden=64, layers=2, init_std=0.1)


def _steps(model, cache, chunks, **kwargs):
    with torch.inference_mode():
        return [model(input_ids=c.view(1, -1), cache=cache, use_cache=True, **kwargs).logits[0] for c in chunks]


@pytest.mark.parametrize("ids", [None, list(range(0, V, 3))], ids=["full-head", "subset-head"])
def test_logits_equal_transformers_through_prefill_steps_crops_and_cache_growth(ids) -> None:
    """GQA (4 heads, 2 kv heads), a 7-token prefill, 90 single steps (the cache grows past its first 64
    slots), crops and multi-token chunks after them: every logit as transformers computes it."""
    draft = tiny_llama(V, seed=5, hidden=32, layers=2, heads=4, kv_heads=2, init_std=0.2)
    ours, theirs = CompactLlama(draft, ids), (SubsetHeadDraft(draft, ids) if ids else draft)
    ours_cache, their_cache = ours.new_cache(), DynamicCache(config=draft.config)
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randint(3, V, (7,), generator=g)] + [torch.randint(3, V, (1,), generator=g) for _ in range(90)]
    for crop, chunk in [(None, chunks), (-5, [torch.randint(3, V, (3,), generator=g)]), (-2, chunks[1:4])]:
        if crop:
            ours_cache.crop(crop)
            their_cache.crop(crop)
        got, want = _steps(ours, ours_cache, chunk), _steps(theirs, their_cache, chunk)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            assert torch.equal(torch.isinf(a), torch.isinf(b))
            finite = torch.isfinite(b)
            assert torch.allclose(a[finite], b[finite].float(), atol=1e-5)
    assert ours_cache.get_seq_length() == their_cache.get_seq_length() == 7 + 90 - 5 + 3 - 2 + 3


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_bfloat16_logits_are_transformers_bit_for_bit(kv_heads: int) -> None:
    """bf16, where every kernel's order of rounding shows: a prefill, single steps, crops and multi-token
    chunks on top of the cache (the verify pass) give transformers' logits exactly, so a target run through
    this forward decodes to transformers' tokens, ties included."""
    model = tiny_llama(V, seed=6, hidden=64, layers=2, heads=4, kv_heads=kv_heads, init_std=0.2, dtype=torch.bfloat16)
    ours = CompactLlama(model)
    ours_cache, their_cache = ours.new_cache(8), DynamicCache(config=model.config)  # 8: the cache grows on the way
    g = torch.Generator().manual_seed(2)
    chunks = [torch.randint(3, V, (40,), generator=g)] + [torch.randint(3, V, (1,), generator=g) for _ in range(30)]
    for crop, chunk in [(None, chunks), (-3, [torch.randint(3, V, (5,), generator=g)]), (-4, [torch.randint(3, V, (n,), generator=g) for n in (2, 3, 4, 1)])]:
        if crop:
            ours_cache.crop(crop)
            their_cache.crop(crop)
        for a, b in zip(_steps(ours, ours_cache, chunk), _steps(model, their_cache, chunk)):
            assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b)


def test_seeded_sampling_with_the_compact_draft_equals_sampling_with_transformers_draft(target) -> None:
    """A drop-in: same weights, same seed, same proposals and the same sampled output."""
    plain = layer_skip_draft(target, 1)
    prompt = torch.tensor([5, 17, 40, 9])
    runs = [generate_speculative(target, d, prompt, 48, draft_tokens=4, temperature=0.8, seed=42, guard=False)
            for d in (plain, CompactLlama(plain))]
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].stats.accepted == runs[1].stats.accepted


@pytest.mark.parametrize("change", [
    {"attention_bias": True}, {"mlp_bias": True}, {"hidden_act": "gelu"},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
])
def test_drafts_it_does_not_compute_exactly_run_through_transformers(change: dict) -> None:
    config = tiny_llama_config(V, hidden=16, layers=1, heads=2, kv_heads=1)
    for key, value in change.items():
        setattr(config, key, value)
    assert not supports(config)
    from transformers import LlamaForCausalLM

    draft = LlamaForCausalLM(config).eval()
    assert runtime_draft(draft, {}) is draft and runtime_target(draft) is draft
    assert isinstance(runtime_draft(draft, {"draft_vocab": [0, 1, 2]}), SubsetHeadDraft)
    with pytest.raises(ValueError):
        CompactLlama(draft)


def test_a_plain_llama_draft_runs_compact(target) -> None:
    draft = layer_skip_draft(target, 1)
    assert supports(draft.config)
    assert isinstance(runtime_draft(draft, {}), CompactLlama)
    assert runtime_draft(draft, {"draft_vocab": [0, 1, 2]}).ids.tolist() == [0, 1, 2]


def test_a_llama_target_runs_compact_to_the_same_greedy_output() -> None:
    """The target through our forward: plain decoding gives transformers' tokens, and so does speculation
    with both models compact (fp32, 4 layers, GQA, 120 tokens)."""
    target = tiny_llama(V, seed=11, hidden=64, layers=4, heads=4, kv_heads=2, init_std=0.15)
    fast = runtime_target(target)
    assert isinstance(fast, CompactLlama) and fast.ids is None
    prompt = [5, 17, 40, 9, 33]
    want = generate_plain(target, prompt, 120).tokens
    assert generate_plain(fast, prompt, 120).tokens == want
    draft = runtime_draft(layer_skip_draft(target, 2), {})
    run = generate_speculative(fast, draft, prompt, 120, draft_tokens=4, guard=False)
    assert run.tokens == want and run.stats.drafted > 0


def test_new_cache_reserves_the_room_asked_for_once() -> None:
    model = CompactLlama(tiny_llama(V, seed=2, hidden=32, layers=2, heads=4, kv_heads=2))
    cache = model.new_cache(300)
    keys = cache.keys
    assert keys.shape[3] >= 300 and cache.get_seq_length() == 0
    _steps(model, cache, [torch.arange(3, 103), *torch.arange(103, 303).split(1)])
    assert cache.keys is keys and cache.get_seq_length() == 300  # filled to the brim without a copy


# --- built without transformers (runner.models.loading, compact): what `bundle run` and `serve` run ---------------

def _config_dicts():
    """config.json as transformers writes it (in full and as save_pretrained's diff) and with fields left out."""
    from tests.tinymodels import tiny_config

    for arch in ("llama", "qwen2", "mistral"):
        config = tiny_config(arch, V, hidden=64, layers=2, heads=4, kv_heads=2)
        full, diff = config.to_dict(), config.to_diff_dict()
        yield f"{arch}-full", full
        yield f"{arch}-diff", diff
        for left_out in ("num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings", "intermediate_size", "sliding_window"):
            yield f"{arch}-no-{left_out}", {k: v for k, v in full.items() if k != left_out}
        legacy = {k: v for k, v in full.items() if k != "rope_parameters"}
        yield f"{arch}-legacy-rope", {**legacy, "rope_theta": 5000.0, "rope_scaling": None}
        yield f"{arch}-scaled-rope", {**legacy, "rope_theta": 5000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
        yield f"{arch}-gelu", {**full, "hidden_act": "gelu"}
    yield "qwen2-sliding", {**tiny_config("qwen2", V).to_dict(), "use_sliding_window": True, "max_window_layers": 1}


@pytest.mark.parametrize("name,config", list(_config_dicts()), ids=[n for n, _ in _config_dicts()])
def test_compact_config_reads_config_json_as_transformers_config_classes_do(name: str, config: dict) -> None:
    """The defaults of a field config.json leaves out, the legacy RoPE fields and what is supported: as
    transformers' own config class for that model_type reads the same dict."""
    from transformers import AutoConfig

    from runner.models.compact_llama import compact_config

    rest = {k: v for k, v in config.items() if k != "model_type"}
    theirs, ours = AutoConfig.for_model(config["model_type"], **rest), compact_config(config)
    assert (ours is not None) == supports(theirs)
    if ours is None:
        return
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads)
    assert ours.rope_parameters["rope_theta"] == theirs.rope_parameters["rope_theta"]


def _files(tmp_path: Path, model) -> "ModelFiles":
    import hashlib

    from runner.models.loading import ModelFiles

    model.save_pretrained(tmp_path, safe_serialization=True)
    return ModelFiles(tmp_path, "target", {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()})


@pytest.mark.parametrize("pack", [False, True], ids=["as-stored", "packed"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_a_model_loaded_without_transformers_gives_its_bfloat16_logits_bit_for_bit(tmp_path: Path, arch: str, pack: bool,
                                                                                  monkeypatch) -> None:
    """bf16 from the same files: the logits of transformers' model loaded from them, prefill, steps and a verify
    chunk; built from the checkpoint's tensors as they are (views of the hashed buffer, no copy) where packing
    does not pay, and with the layers packed and fused (runner.models.packed) where it does."""
    from runner.models import packed
    from runner.models.loading import load_models
    from runner.checks.modelinfo import read_safetensors_header
    from tests.tinymodels import tiny_model

    if pack and not packed.pays(torch.bfloat16, torch.get_num_threads()):
        pytest.skip("packed bf16 weights do not pay (or do not give F.linear's bits) on this CPU")
    if not pack:
        monkeypatch.setattr(packed, "pays", lambda dtype, threads: False)
    files = _files(tmp_path, tiny_model(arch, V, seed=4, hidden=64, layers=2, heads=4, kv_heads=2, init_std=0.2, dtype=torch.bfloat16))
    (ours,), (theirs,) = load_models([files], "bfloat16", "cpu", compact=True), load_models([files], "bfloat16", "cpu")
    assert isinstance(ours, CompactLlama) and not isinstance(theirs, CompactLlama)
    layer = ours.weights.layers[1]
    if pack:
        assert layer.qkv.is_mkldnn and layer.gate_up.is_mkldnn and ours.head.is_mkldnn and not hasattr(layer, "q")
    else:
        header = read_safetensors_header(tmp_path / "model.safetensors")
        placed = {"model.embed_tokens.weight": ours.weights.embed, "model.norm.weight": ours.weights.norm,
                  "model.layers.1.self_attn.k_proj.weight": layer.k, "model.layers.1.mlp.down_proj.weight": layer.down}
        base = ours.weights.embed.data_ptr() - header["model.embed_tokens.weight"]["data_offsets"][0]
        assert {k: t.data_ptr() - base for k, t in placed.items()} == {k: header[k]["data_offsets"][0] for k in placed}
    reference = CompactLlama(theirs)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    g = torch.Generator().manual_seed(1)
    chunks = [torch.randint(3, V, (9,), generator=g), *torch.randint(3, V, (6,), generator=g).split(1), torch.randint(3, V, (4,), generator=g)]
    for a, b in zip(_steps(ours, ours.new_cache(), chunks), _steps(reference, reference.new_cache(), chunks)):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)


@pytest.mark.parametrize("layout", ["transposed", "mkl"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_float32_weights_laid_out_for_mkl_give_transformers_logits_alone_and_in_a_batch(tmp_path: Path, arch: str,
                                                                                       layout: str, monkeypatch) -> None:
    """float32 where a layout of its own pays (runner.models.packed; forced here, on a model below its size
    floor): each projection held as its transpose, or packed once for MKL's packed product (`MklPacked`, called
    at every row count of the passes below: 9, 1, 4, and 16 batched), q/k/v and gate/up fused, the head
    transposed; the logits of transformers' model from the same files (within float32's rounding: F.linear's
    own bits move with the row count), one sequence and a batched pass of three (runner.models.row_plan) alike."""
    from runner.models import packed
    from runner.models.loading import load_models
    from tests.tinymodels import tiny_model

    if layout == "mkl" and not packed.MklPacked.available():
        pytest.skip("this torch has no MKL packed product")
    monkeypatch.setattr(packed, "transposed_pays", lambda dtype, threads: dtype == torch.float32)
    monkeypatch.setattr(packed, "mkl_pays", lambda threads: layout == "mkl")
    monkeypatch.setattr(packed, "SMALL_BYTES", 0)
    files = _files(tmp_path, tiny_model(arch, V, seed=4, hidden=64, layers=2, heads=4, kv_heads=2, init_std=0.2))
    (ours,), (theirs,) = load_models([files], "float32", "cpu", compact=True), load_models([files], "float32", "cpu")
    layer = ours.weights.layers[1]
    assert ours.weights.transposed and not hasattr(layer, "q")
    laid_out = [layer.qkv, layer.gate_up, layer.o, layer.down]
    if layout == "mkl":
        assert all(isinstance(w, packed.MklPacked) and w.dtype == torch.float32 for w in laid_out)
        attn, mlp = theirs.model.layers[1].self_attn, theirs.model.layers[1].mlp
        fused = [torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                 torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), attn.o_proj.weight, mlp.down_proj.weight]
        assert [w.shape for w in laid_out] == [w.shape for w in fused]
        laid_out = []
    for laid in (*laid_out, ours.head):  # (out, in), its transpose contiguous
        assert laid.t().is_contiguous() and not laid.is_contiguous()
    assert (layer.qkv_bias is not None) == (arch == "qwen2")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    g = torch.Generator().manual_seed(1)
    chunks = [torch.randint(3, V, (9,), generator=g), *torch.randint(3, V, (6,), generator=g).split(1), torch.randint(3, V, (4,), generator=g)]
    reference = CompactLlama(theirs)
    for a, b in zip(_steps(ours, ours.new_cache(), chunks), _steps(reference, reference.new_cache(), chunks)):
        assert torch.allclose(a, b, atol=1e-5)
    prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (5, 8, 3)]
    with torch.inference_mode():
        cache = ours.new_batched_cache(3, 32)
        batched = ours.forward_rows(cache, [(i, 0, p) for i, p in enumerate(prompts)], [4, 12, 15])
        for i, prompt in enumerate(prompts):
            alone = reference(input_ids=torch.tensor([prompt]), cache=reference.new_cache(), logits_to_keep=1).logits[0, -1]
            assert torch.allclose(batched[i], alone, atol=1e-5)


@pytest.mark.parametrize("rows", [0, 1, 3, 8, 17, 64, 100])
def test_a_weight_packed_once_for_mkl_serves_every_row_count_with_its_bias(rows: int) -> None:
    """MklPacked is packed for 64 rows and called with each pass's own (runner.models.packed): at every row count,
    none included, a 2-D or 3-D input, with a bias or without, F.linear's result within float32's rounding, and
    the weight's own shape, dtype and element count (a model's parameter count reads them)."""
    from runner.models import packed

    if not packed.MklPacked.available():
        pytest.skip("this torch has no MKL packed product")
    g = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 40, generator=g), torch.randn(96, generator=g)
    laid = packed.MklPacked(weight)
    assert (laid.shape, laid.dtype, laid.numel()) == (weight.shape, torch.float32, 96 * 40)
    for x in (torch.randn(rows, 40, generator=g), torch.randn(1, rows, 40, generator=g)):
        for b in (None, bias):
            out = packed.linear(x, laid, b)
            assert out.shape == (*x.shape[:-1], 96)
            assert torch.allclose(out, torch.nn.functional.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_a_checkpoint_that_is_not_exactly_the_configs_goes_to_transformers_and_its_checks(tmp_path: Path) -> None:
    """An extra tensor: not built compact; transformers' build refuses it as before (exit 6)."""
    from safetensors.torch import load_file, save_file

    from core.errors import BundleError
    from runner.models.loading import load_models

    files = _files(tmp_path, tiny_llama(V, seed=3, hidden=32, layers=1, heads=4, kv_heads=2))
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    save_file({**tensors, "model.layers.0.extra.weight": torch.zeros(4)}, str(path), metadata={"format": "pt"})
    with pytest.raises(BundleError) as err:
        load_models([files.__class__(files.model_dir, files.role)], "float32", "cpu", compact=True)
    assert err.value.code == "invalid-bundle" and "unexpected" in str(err.value)


def test_bundle_run_on_a_llama_pair_never_imports_transformers(tmp_path: Path) -> None:
    """The whole of run_unpacked (gate, preflight, load, decode) in a fresh interpreter: transformers stays
    unimported (its import is ~4 s of a `bundle run` on this CPU)."""
    import subprocess
    import sys

    from tests.tinymodels import make_pair

    make_pair(tmp_path / "pair")
    code = (
        "import sys; from runner.run import run_unpacked; "
        f"r = run_unpacked({str(tmp_path / 'pair')!r}, {{'target': 'target/', 'draft': 'draft/', 'tokenizer': 'tokenizer/'}}, {{}}, 'hi', max_new_tokens=4); "
        "print(r['forward'], sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "{'target': 'compact', 'draft': 'compact'} []"
