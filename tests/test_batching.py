"""Continuous batching (runner.decoding.batching): several generations in one context, one sequence id each, on
both engines: a tiny GGUF pair written by the test (tests/tinygguf.py) on llama.cpp, and a tiny Llama pair made
here on torch (runner.models.compact_llama's batched forward). A request's output does not depend on what else is
in the batch: greedy equals its single-request greedy; sampling follows the target."""

from __future__ import annotations

import pytest
import torch

from runner.decoding.batching import BatchedGenerator, default_sequences
from runner.engines.torch_engine import TorchSharedContext
from runner.engines import as_engine
from runner.engines.llamacpp import load
from runner.models.compact_llama import CompactLlama
from runner.decoding.speculative import generate_plain
from tests.tinygguf import write_gguf

PROMPTS = [[261, 223, 83, 87, 75, 307, 270], [83, 87], [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310, 311],
           [261], [75, 76, 77, 78], [90, 91, 92, 93, 94, 95], [270, 261, 223], [120, 121, 122, 123, 124]]
N_CTX = 256
# A batch computes a position with other kernels than a lone step (other shapes, other summation orders), so
# float32 logits differ in their last digits; where the top two are that close, either token is the target's
# greedy choice. The tie rule: at the first difference, the two tokens' logits in the single-request
# computation are within this share of its top logit (and nowhere else do the outputs differ before it).
TIE = 1e-3


def _torch_llama(seed: int, layers: int, hidden: int = 128, heads: int = 4, kv_heads: int = 2, vocab: int = 400,
                 std: float = 0.3, logit_scale: float = 3.0, like: torch.nn.Module | None = None) -> torch.nn.Module:
    """A random tiny Llama for the torch engine, drawn as tests/tinygguf.py draws its GGUF files (normal weights of
    `std`, unit norms, the output layer logit_scale times larger); `like`: take its weights where the shapes
    match (a layer-skip draft of it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * std * (logit_scale if name == "lm_head.weight" else 1))
        if like is not None:
            model.load_state_dict({k: v for k, v in like.state_dict().items() if k in model.state_dict()})
    return model


@pytest.fixture(scope="module", params=["llama.cpp", "torch"])
def pair(request, tmp_path_factory):
    if request.param == "torch":
        target = _torch_llama(0, layers=2)
        # the target's own first layer (a layer-skip draft): it agrees often, not always
        return CompactLlama(target), CompactLlama(_torch_llama(0, layers=1, like=target))
    d = tmp_path_factory.mktemp("gguf-batch")
    target = load(write_gguf(d / "target.gguf", seed=0, hidden=128, layers=2, logit_scale=3), n_ctx=N_CTX, threads=1)
    # the target's own first layer (a layer-skip draft): it agrees often, not always
    draft = load(write_gguf(d / "draft.gguf", seed=0, hidden=128, layers=1, logit_scale=3), n_ctx=N_CTX, threads=1)
    return target, draft


@pytest.fixture(scope="module")
def stranger(pair, tmp_path_factory):
    """A draft that rarely agrees with the target (another random model), of the pair's engine."""
    if isinstance(pair[0], CompactLlama):
        return CompactLlama(_torch_llama(7, layers=1, hidden=32, heads=2, kv_heads=1))
    path = write_gguf(tmp_path_factory.mktemp("gguf-stranger") / "stranger.gguf", seed=7, hidden=32, layers=1, heads=2,
                      kv_heads=1, logit_scale=3)
    return load(path, n_ctx=N_CTX, threads=1)


def _cells_gone(generator: BatchedGenerator, seq: int) -> bool:
    """No cache cell of the sequence is left in the target's context (llama.cpp), or none is counted (torch:
    cells past a sequence's length are never read)."""
    if isinstance(generator.target, TorchSharedContext):
        return generator.target.contents[seq] == []
    import llama_cpp

    memory = llama_cpp.llama_get_memory(generator.target.ctx)
    return llama_cpp.llama_memory_seq_pos_max(memory, seq) == -1 and generator.target.contents[seq] == []


def _single(target, prompt: list[int], n: int) -> list[int]:
    return generate_plain(target, prompt, n).tokens


def _equal_up_to_ties(target, prompt: list[int], got: list[int], n: int) -> bool:
    """got equals the single request's greedy output, or leaves it first where the two tokens tie (TIE)."""
    target = as_engine(target)
    expected = _single(target, prompt, n)
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    if i is None:
        return len(expected) == len(got)
    target.reset(len(prompt) + n)  # the single request's computation, replayed: prefill, then single steps
    if len(prompt) > 1:
        target.forward(torch.tensor(prompt[:-1]), last_only=True)
    for token in [prompt[-1], *expected[:i]]:
        logits = target.forward(torch.tensor([token]), last_only=True)[0]
    return float(logits[expected[i]] - logits[got[i]]) <= TIE * float(logits.abs().max())


@pytest.mark.parametrize("speculate", [False, True], ids=["plain", "speculative"])
def test_batched_greedy_equals_single_request_greedy_in_a_batch_of_8(pair, speculate: bool) -> None:
    target, draft = pair
    generator = BatchedGenerator(target, draft if speculate else None, sequences=8, n_ctx_seq=N_CTX, draft_tokens=3, guard=False)
    seqs = generator.run([{"prompt_ids": p, "max_new_tokens": 24} for p in PROMPTS])
    assert max(generator.batch_sizes) == 8
    for prompt, s in zip(PROMPTS, seqs):
        assert _equal_up_to_ties(target, prompt, s.tokens, 24), prompt
    if speculate:
        drafted = sum(s.stats.drafted for s in seqs)
        accepted = sum(s.stats.accepted for s in seqs)
        assert drafted and 0 < accepted < drafted  # both verify outcomes ran in the batch


@pytest.mark.parametrize("methods", [("ngram",), ("ngram+draft",)])
def test_batched_ngram_proposals_keep_each_request_its_single_request_greedy(pair, methods: tuple[str, ...]) -> None:
    """Prompt lookup in the one step, in a batch of 8: "ngram" with no draft model, "ngram+draft" with one (the
    draft catching up on accepted n-gram tokens); each answer is its single-request greedy answer."""
    target, draft = pair
    prompts = [p + p[:3] for p in PROMPTS]  # each prompt's start repeated: the n-gram index matches from the first step
    generator = BatchedGenerator(target, draft if "draft" in methods[0] else None, sequences=8, n_ctx_seq=N_CTX,
                                 draft_tokens=3, guard=False, methods=methods)
    seqs = generator.run([{"prompt_ids": p, "max_new_tokens": 24} for p in prompts])
    for prompt, s in zip(prompts, seqs):
        assert _equal_up_to_ties(target, prompt, s.tokens, 24), prompt
    assert sum(s.stats.by_method.get("ngram", [0, 0])[1] for s in seqs) > 0


def test_requests_join_and_leave_mid_batch_and_their_ids_are_reused(pair) -> None:
    target, draft = pair
    generator = BatchedGenerator(target, draft, sequences=3, n_ctx_seq=N_CTX, draft_tokens=2, guard=False)
    lengths = [5, 30, 12, 3, 20, 9]
    active: list[list[int]] = []
    seqs = generator.run([{"prompt_ids": p, "max_new_tokens": n} for p, n in zip(PROMPTS, lengths)],
                         on_step=lambda: active.append([s.seq for s in generator.active()]))
    for prompt, n, s in zip(PROMPTS, lengths, seqs):
        assert s.done and _equal_up_to_ties(target, prompt, s.tokens, n)
    assert max(len(a) for a in active) == 3 and len({s.seq for s in seqs}) == 3  # six requests through three ids
    # the second request (30 tokens) was decoding while others joined after it and left before it
    assert any(seqs[1].seq in a and seqs[4].seq in a for a in active)
    assert generator.free() == 3 and generator.target.lengths == [0, 0, 0] and generator.draft.lengths == [0, 0, 0]


def test_a_cancelled_sequence_leaves_at_once_and_its_cache_cells_are_removed(pair) -> None:
    target, draft = pair
    generator = BatchedGenerator(target, draft, sequences=2, n_ctx_seq=N_CTX, draft_tokens=2, guard=False)
    stays = generator.add(PROMPTS[0], 16)
    leaves = generator.add(PROMPTS[2], 16)
    for _ in range(3):
        generator.step()
    assert generator.target.lengths[leaves.seq] > len(PROMPTS[2])
    generator.cancel(leaves)
    assert generator.free() == 1 and _cells_gone(generator, leaves.seq)
    joined = generator.add(PROMPTS[3], 8)  # a new request takes the freed id
    assert joined.seq == leaves.seq
    while generator.active():
        generator.step()
    assert _equal_up_to_ties(target, PROMPTS[0], stays.tokens, 16) and _equal_up_to_ties(target, PROMPTS[3], joined.tokens, 8)


def test_on_tokens_returning_true_stops_the_sequence_after_that_step(pair) -> None:
    target, _ = pair
    generator = BatchedGenerator(target, None, sequences=2, n_ctx_seq=N_CTX)
    seen: list[list[int]] = []
    s = generator.add(PROMPTS[0], 50, on_tokens=lambda new: seen.append(new) or len(seen) == 4)
    while generator.active():
        generator.step()
    assert len(s.tokens) == 4 and generator.free() == 2


def test_sampled_tokens_follow_the_target_distribution_in_a_batch(pair, stranger) -> None:
    """800 seeded requests, 8 at a time, a draft that rarely agrees, k=2: the first token comes with the prompt's
    pass, the second from a verify pass (accepted draft or resampled); both tokens' marginals match the target's
    own softmax within 0.1 total variation, while the draft's second-token distribution is more than 0.3 away."""
    target, _ = pair
    generator = BatchedGenerator(target, stranger, sequences=8, n_ctx_seq=N_CTX, draft_tokens=2, adaptive=False, guard=False)
    runs, vocab, prompt = 800, generator.target.vocab_size, PROMPTS[0]
    target, stranger = as_engine(target), as_engine(stranger)
    seqs = generator.run([{"prompt_ids": prompt, "max_new_tokens": 4, "temperature": 1.0, "seed": seed} for seed in range(runs)])
    # each second token came from a verify pass over two drafts, right after the prompt's pass
    assert all(s.stats.target_calls[1] == (len(prompt), 3) for s in seqs)
    counts = torch.zeros(2, vocab)
    for s in seqs:
        for position, token in enumerate(s.tokens[:2]):
            counts[position, token] += 1

    def next_distribution(engine, prefix: list[int]) -> torch.Tensor:
        engine.reset(len(prefix) + 1)
        return torch.softmax(engine.forward(torch.tensor(prefix), last_only=True)[0], -1)

    p1 = next_distribution(target, prompt)
    p2, q2 = torch.zeros(vocab), torch.zeros(vocab)
    for first in torch.nonzero(p1 > 1e-4).view(-1).tolist():  # the rest weighs < 0.03 in all
        p2 += p1[first] * next_distribution(target, prompt + [first])
        q2 += p1[first] * next_distribution(stranger, prompt + [first])
    assert 0.5 * (p2 - q2).abs().sum() > 0.3
    for position, exact in enumerate((p1, p2)):
        assert 0.5 * (counts[position] / runs - exact / exact.sum()).abs().sum() < 0.1, position


def test_each_sequence_keeps_its_own_guard_and_falls_back_alone(pair, stranger) -> None:
    """A draft that rarely agrees, with the guard on: each sequence's guard falls back on its own costs, and
    the output is still the target's."""
    target, _ = pair
    generator = BatchedGenerator(target, stranger, sequences=4, n_ctx_seq=N_CTX, draft_tokens=3, guard=True)
    seqs = generator.run([{"prompt_ids": p, "max_new_tokens": 64} for p in PROMPTS[:4]])
    for prompt, s in zip(PROMPTS, seqs):
        assert _equal_up_to_ties(target, prompt, s.tokens, 64)
        assert s.stats.fallback is not None and s.stats.plain_steps > s.stats.speculative_iterations


def test_long_prompts_are_prefilled_in_chunks_and_caught_up_by_the_draft(pair, tmp_path) -> None:
    """Prompts longer than one batch (512 tokens): the target prefills them over several steps while another
    request decodes, and the draft's first pass over them (more than a batch in all) runs one at a time."""
    if isinstance(pair[0], CompactLlama):
        target, draft = pair
    else:  # llama.cpp engines with room for the long prompts
        target = load(write_gguf(tmp_path / "target.gguf", seed=0, hidden=128, layers=2, logit_scale=3), n_ctx=1024, threads=1)
        draft = load(write_gguf(tmp_path / "draft.gguf", seed=0, hidden=128, layers=1, logit_scale=3), n_ctx=1024, threads=1)
    prompts = [[100 + i % 200 for i in range(700)], [50 + i % 150 for i in range(300)], [60 + i % 140 for i in range(320)], PROMPTS[0]]
    generator = BatchedGenerator(target, draft, sequences=4, n_ctx_seq=1024, draft_tokens=3, guard=False)
    seqs = generator.run([{"prompt_ids": p, "max_new_tokens": 12} for p in prompts])
    for prompt, s in zip(prompts, seqs):
        assert s.stats.drafted and _equal_up_to_ties(target, prompt, s.tokens, 12), len(prompt)
    assert [n for _, n in seqs[0].stats.target_calls[:2]] == [512, 700 - 512]  # a batch's worth, then the rest


@pytest.mark.parametrize("speculate", [False, True], ids=["plain", "speculative"])
def test_a_request_sharing_a_finished_ones_prompt_prefix_reuses_its_cells_and_answers_as_afresh(pair, speculate: bool) -> None:
    """cache_prompts, one id: the second request prefills only what follows the common prefix (in both models'
    caches), and its tokens are those of a generator that never saw the first request."""
    target, draft = pair
    preamble = [300, 301, 302, 303, 304, 305, 306, 307, 308, 309]
    first, second = preamble + [90, 91, 92], preamble + [261, 223, 83]

    def generator(cache: bool) -> BatchedGenerator:
        return BatchedGenerator(target, draft if speculate else None, sequences=1, n_ctx_seq=N_CTX, draft_tokens=3,
                                guard=False, cache_prompts=cache)

    cached = generator(True)
    cached.run([{"prompt_ids": first, "max_new_tokens": 16}])
    again = cached.run([{"prompt_ids": second, "max_new_tokens": 16}])[0]
    fresh = generator(False).run([{"prompt_ids": second, "max_new_tokens": 16}])[0]
    assert again.cached == len(preamble) and again.stats.target_calls[0] == (len(preamble), 3)
    assert again.tokens == fresh.tokens and _equal_up_to_ties(target, second, again.tokens, 16)
    if speculate:
        assert again.draft_cached == len(preamble) and again.stats.drafted


def test_the_same_prompt_again_runs_only_its_last_token(pair) -> None:
    target, draft = pair
    generator = BatchedGenerator(target, draft, sequences=1, n_ctx_seq=N_CTX, draft_tokens=3, guard=False, cache_prompts=True)
    first = generator.run([{"prompt_ids": PROMPTS[2], "max_new_tokens": 10}])[0]
    again = generator.run([{"prompt_ids": PROMPTS[2], "max_new_tokens": 10}])[0]
    assert again.cached == len(PROMPTS[2]) - 1 and again.draft_cached == len(PROMPTS[2])
    assert again.stats.target_calls[0] == (len(PROMPTS[2]) - 1, 1) and again.tokens == first.tokens


def test_a_new_request_takes_the_free_id_holding_its_longest_prefix_and_cancelled_cells_are_dropped(pair) -> None:
    target, _ = pair
    generator = BatchedGenerator(target, None, sequences=3, n_ctx_seq=N_CTX, cache_prompts=True)
    a, b = generator.run([{"prompt_ids": PROMPTS[0], "max_new_tokens": 4}, {"prompt_ids": PROMPTS[2], "max_new_tokens": 4}])
    assert generator.free() == 3 and generator.target.lengths[a.seq] and generator.target.lengths[b.seq]
    joined = generator.add(PROMPTS[2][:6] + [5, 6], 4)
    assert joined.seq == b.seq and joined.cached == 6
    stranger = generator.add([7, 8, 9], 4)  # nothing in common with anyone: the id given back longest ago, or unused
    assert stranger.seq not in (a.seq, b.seq) and stranger.cached == 0
    generator.step()
    generator.cancel(joined)
    assert _cells_gone(generator, joined.seq)


@pytest.mark.parametrize("speculate", [False, True], ids=["plain", "speculative"])
def test_a_prompt_whose_id_another_request_took_comes_back_from_the_prompt_cache_and_answers_as_afresh(pair, speculate: bool) -> None:
    """One id, a prompt cache: A, then B (unrelated: A's cells are copied to host memory before B overwrites them),
    then A again, which gets its cells back in both models' caches and prefills only its last token. Without the
    prompt cache A starts afresh. Its tokens are those of its first run either way."""
    target, draft = pair
    a, b = PROMPTS[2], PROMPTS[0]

    def generator(cache_bytes: int) -> BatchedGenerator:
        return BatchedGenerator(target, draft if speculate else None, sequences=1, n_ctx_seq=N_CTX, draft_tokens=3, guard=False,
                                cache_prompts=True, prompt_cache_bytes=cache_bytes)

    cached, uncached = generator(64 << 20), generator(0)
    for g in (cached, uncached):
        first = g.run([{"prompt_ids": a, "max_new_tokens": 10}])[0]
        g.run([{"prompt_ids": b, "max_new_tokens": 10}])
        again = g.run([{"prompt_ids": a, "max_new_tokens": 10}])[0]
        assert again.tokens == first.tokens
        if g is cached:
            assert again.cached == len(a) - 1 and again.stats.target_calls[0] == (len(a) - 1, 1)
            assert g.prompt_cache.saved == 2 and g.prompt_cache.restored == 1  # A's cells, then B's for A's return
            if speculate:
                assert again.draft_cached == len(a)
        else:
            assert g.prompt_cache is None and again.cached == 0


def test_cells_of_a_request_that_never_ran_the_draft_come_back_without_draft_cells_and_the_draft_catches_up(pair) -> None:
    """A request advised plain never runs the draft: its copy holds the target's cells only; a later request with
    its prompt gets those back, the draft prefills the prompt itself, and the answer is unchanged."""
    target, draft = pair
    generator = BatchedGenerator(target, draft, sequences=1, n_ctx_seq=N_CTX, draft_tokens=3, cache_prompts=True,
                                 prompt_cache_bytes=64 << 20)
    a, b = PROMPTS[2], PROMPTS[0]
    first = generator.run([{"prompt_ids": a, "max_new_tokens": 10, "start_plain": "advised"}])[0]
    generator.run([{"prompt_ids": b, "max_new_tokens": 10, "start_plain": "advised"}])
    assert [e.draft_state for e in generator.prompt_cache.entries] == [None]
    again = generator.run([{"prompt_ids": a, "max_new_tokens": 10}])[0]
    assert again.cached == len(a) - 1 and again.draft_cached == 0 and again.stats.drafted
    assert again.tokens == first.tokens


def test_a_cancelled_requests_cells_never_reach_the_prompt_cache(pair) -> None:
    target, _ = pair
    generator = BatchedGenerator(target, None, sequences=1, n_ctx_seq=N_CTX, cache_prompts=True, prompt_cache_bytes=64 << 20)
    s = generator.add(PROMPTS[2], 10)
    generator.step()
    generator.cancel(s)
    again = generator.run([{"prompt_ids": PROMPTS[0], "max_new_tokens": 4}, {"prompt_ids": PROMPTS[2], "max_new_tokens": 4}])[1]
    assert again.cached == 0 and all(e.tokens[: len(PROMPTS[2])] != PROMPTS[2] for e in generator.prompt_cache.entries)


def test_the_prompt_cache_keeps_within_its_bytes_least_recently_used_first() -> None:
    from runner.decoding.prompt_cache import HEAD, CacheEntry, PromptCache

    def entry(tokens: list[int], size: int) -> CacheEntry:
        return CacheEntry(tokens, None, [], None, size)

    cache = PromptCache(300)
    cache.add(entry([1, 2, 3], 100))
    cache.add(entry([4, 5, 6], 100))
    cache.add(entry([1, 2, 3, 4], 100))  # contains the first: the first is dropped
    assert [e.tokens for e in cache.entries] == [[4, 5, 6], [1, 2, 3, 4]] and cache.size == 200
    assert cache.find([4, 5, 6, 7], have=0).tokens == [4, 5, 6]  # now the most recently used
    assert cache.find([4, 5, 6, 7], have=3) is None  # the id holds as much already
    cache.add(entry([7, 8], 150))  # over 300 bytes: the least recently used goes
    assert [e.tokens for e in cache.entries] == [[4, 5, 6], [7, 8]]
    cache.add(entry([9], 301))  # larger than the whole cache: not kept
    assert [e.tokens for e in cache.entries] == [[4, 5, 6], [7, 8]]
    assert cache.should_save([1, 2, 3, 4, 5], kept=2) and not cache.should_save([1, 2, 3, 4, 5], kept=3)
    assert not cache.should_save([4, 5, 6], kept=0)  # an entry holds them already
    assert not PromptCache(0).should_save([1, 2, 3], kept=0)
    # prefixes longer than the head compared at once (HEAD tokens) are compared to the end
    long = PromptCache(1000)
    base = list(range(1, HEAD + 45))
    long.add(entry(base + [1, 2], 10))
    long.add(entry(base + [3, 4, 5], 10))
    assert long.find(base + [3, 4, 9], have=0).tokens == base + [3, 4, 5]
    assert long.find(base + [1, 2, 3], have=len(base) + 2) is None and not long.should_save(base + [1], kept=0)


def test_new_requests_take_ids_next_to_the_active_ones(pair) -> None:
    """llama.cpp runs a batch's attention over every sequence between its lowest and highest id, idle ones too:
    with 8 ids, cached prompts and at most 4 requests at once, joining and leaving at different steps, the
    active ids always lie within 4 consecutive ids, and every answer is still its single-request answer."""
    target, _ = pair
    generator = BatchedGenerator(target, None, sequences=8, n_ctx_seq=N_CTX, cache_prompts=True)
    lengths = [3, 9, 5, 12, 4, 7, 10, 2, 6, 8, 11, 5]
    waiting = [(PROMPTS[i % len(PROMPTS)], n) for i, n in enumerate(lengths)]
    seqs, spans = [], []
    while waiting or generator.active():
        while waiting and len(generator.active()) < 4:
            prompt, n = waiting.pop(0)
            seqs.append((prompt, n, generator.add(prompt, n)))
        ids = [s.seq for s in generator.active()]
        spans.append(max(ids) - min(ids))
        generator.step()
    assert max(spans) <= 3 and len(seqs) == len(lengths)
    for prompt, n, s in seqs:
        assert _equal_up_to_ties(target, prompt, s.tokens, n)


def test_default_sequences_fit_the_memory_left() -> None:
    assert default_sequences(100, 1000) == 8  # capped
    assert default_sequences(100, 350) == 3
    assert default_sequences(100, 50) == 1  # one always (the preflight already checked one)


@pytest.mark.parametrize("chunk", [PROMPTS[6], PROMPTS[2] + PROMPTS[0] + PROMPTS[5]], ids=["short-chunk", "long-chunk"])
def test_a_batched_torch_pass_computes_each_row_as_its_sequence_alone(chunk: list[int]) -> None:
    """One pass of rows of every kind (a prompt chunk into an empty sequence, a single step, a verify pass of 4
    tokens on top of a cache, a sequence past the others' ends), the rows in no order of sequence id: each row's
    logits are those of its own tokens run alone through the single-sequence forward (float32: to 1e-5 of the largest).
    A chunk longer than SHORT_ROW attends on its own, the short rows together (runner.models.row_plan)."""
    from runner.models.row_plan import SHORT_ROW, attention_parts

    model = CompactLlama(_torch_llama(3, layers=2))
    context = TorchSharedContext(model, sequences=4, n_ctx_seq=64)
    histories = {0: PROMPTS[2], 1: PROMPTS[0], 3: PROMPTS[4] + PROMPTS[5]}
    context.decode([(seq, tokens, False) for seq, tokens in histories.items()])
    rows = [(3, [5], False), (2, chunk, True), (0, [7, 8, 9, 10], True), (1, [11], True)]
    parts = attention_parts([(seq, context.length(seq), tokens) for seq, tokens, _ in rows], torch.device("cpu"), 2)
    if len(chunk) > SHORT_ROW:
        assert [part.rows for part, _ in parts] == [3, 1] and parts[1][1] == slice(1, 1 + len(chunk))
    else:
        assert parts is None
    got = context.decode(rows)
    for (seq, tokens, all_logits), logits in zip(rows, got):
        cache = model.new_cache()
        with torch.inference_mode():
            if histories.get(seq):
                model(input_ids=torch.tensor([histories[seq]]), cache=cache)
            alone = model(input_ids=torch.tensor([tokens]), cache=cache).logits[0]
        expected = alone if all_logits else alone[-1:]
        assert logits.shape == tuple(expected.shape)
        assert float((torch.from_numpy(logits) - expected).abs().max()) <= 1e-5 * float(expected.abs().max()), seq
    assert context.lengths == [len(PROMPTS[2]) + 4, len(PROMPTS[0]) + 1, len(chunk), len(histories[3]) + 1]
