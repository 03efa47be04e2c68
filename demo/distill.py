"""Distil the demo draft from the target: teacher data generation and training, both resumable.

    .venv/bin/python demo/distill.py gen   --minutes 90   # teacher data: greedy chat answers + local text
    .venv/bin/python demo/distill.py train --minutes 90   # train the draft (starts/continues from ckpt)
    .venv/bin/python demo/distill.py eval                 # held-out acceptance of the best checkpoint
    .venv/bin/python demo/distill.py curve                # acceptance over training time, from the log

Both long commands run one thread by default (DEMO_THREADS=N to change) and stop themselves after
--minutes; rerunning either continues where it stopped (shards already written are kept, training
resumes from demo/work/ckpt/last.pt). They may run at the same time: the trainer picks up new shards
as `gen` writes them.

Data (demo/work/data/, one safetensors shard per batch):
- chat-NNNNN: the target's own greedy answers (bf16, chat template, up to 256 new tokens) to varied
  prompts from demo/training_prompts.py (none of them in runner/bench/prompts.jsonl), with the target's
  top-K logits at every answer position, so the draft trains several passes against soft targets;
- text-NNNNN: chunks of local text (Python standard-library source, /usr/share/doc, man pages) with the
  target's top-K logits from one prefill pass.
Held-out set (demo/work/heldout.safetensors): the target's greedy bf16 continuation of each prompt in
runner/bench/prompts.jsonl. Greedy acceptance = how often the draft's argmax equals the target's next
token along that continuation; the log (demo/work/distill_log.jsonl) records it with the training
wall-clock time, plus the accepted tokens per target pass a k-token speculative loop would get.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import re
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

DEMO = Path(__file__).resolve().parent
ROOT = DEMO.parent
WORK = DEMO / "work"
TARGET_DIR = WORK / "target"
TOKENIZER_DIR = WORK / "tokenizer"
INIT_DIR = WORK / "init"
DATA_DIR = WORK / "data"
CKPT_DIR = WORK / "ckpt"
HELDOUT = WORK / "heldout.safetensors"
LOG = WORK / "distill_log.jsonl"
HELD_OUT_PROMPTS = ROOT / "runner" / "bench" / "prompts.jsonl"
TOP_K = 32
MAX_NEW = 256
TEXT_CHUNK = 256

sys.path.insert(0, str(DEMO))


def threads() -> int:
    return int(os.environ.get("DEMO_THREADS", "1"))


def log(event: dict) -> None:
    """Append one JSON line to the distillation log (and echo it)."""
    event = {"time": round(time.time(), 1), **event}
    with LOG.open("a") as f:
        f.write(json.dumps(event) + "\n")
    print(json.dumps(event), flush=True)


def load_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    tok.padding_side = "left"
    return tok


def load_target(dtype: torch.dtype = torch.bfloat16):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(TARGET_DIR), dtype=dtype)
    model.eval()
    return model


def chat_ids(tok, prompt: str) -> list[int]:
    """Token ids of one user turn with the generation prompt, as `bundle run` builds them."""
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


class TopKRecorder:
    """A logits processor that keeps the top-K raw logits of every generation step, unchanged scores."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.values: list[torch.Tensor] = []
        self.indices: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        v, i = scores.float().topk(self.k, dim=-1)
        self.values.append(v.half())
        self.indices.append(i.int())
        return scores


@torch.inference_mode()
def generate_batch(model, tok, prompts: list[str]) -> list[dict]:
    """Greedy answers for a batch of prompts, with the teacher's top-K logits per answer token.

    A plain loop rather than `generate()`: finished rows leave the batch (and the KV cache) at once,
    which saves the ~30% of steps that padded rows would otherwise cost on chat answers."""
    from transformers import DynamicCache

    eos = tok.eos_token_id
    seqs = [chat_ids(tok, p) for p in prompts]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, width - len(s):] = torch.tensor(s)
        mask[r, width - len(s):] = 1
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = DynamicCache()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1]
    live = list(range(len(seqs)))  # original row of each row still in the batch
    answers: list[list[int]] = [[] for _ in seqs]
    vals: list[list[torch.Tensor]] = [[] for _ in seqs]
    idxs: list[list[torch.Tensor]] = [[] for _ in seqs]
    last_pos = pos[:, -1:]
    while live:
        v, i = logits.float().topk(TOP_K, dim=-1)
        nxt = i[:, 0]
        keep = []
        for r, row in enumerate(live):
            answers[row].append(int(nxt[r]))
            vals[row].append(v[r].half())
            idxs[row].append(i[r].int())
            if int(nxt[r]) != eos and len(answers[row]) < MAX_NEW:
                keep.append(r)
        if not keep:
            break
        if len(keep) < len(live):
            sel = torch.tensor(keep)
            cache.batch_select_indices(sel)
            mask, last_pos, nxt = mask[sel], last_pos[sel], nxt[sel]
            live = [live[r] for r in keep]
        mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype)], 1)
        last_pos = last_pos + 1
        logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos,
                       past_key_values=cache, use_cache=True).logits[:, -1]
    return [{"prompt": s, "answer": answers[r], "vals": torch.stack(vals[r]), "idxs": torch.stack(idxs[r])}
            for r, s in enumerate(seqs)]


def pack_items(items: list[dict]) -> dict[str, torch.Tensor]:
    """Concatenate sequences into one shard: tokens, offsets, and teacher top-K at target positions.

    Position p of `tokens` with teacher data predicts tokens[p + 1]."""
    tokens: list[int] = []
    offsets = [0]
    tgt_pos: list[int] = []
    vals, idxs = [], []
    for it in items:
        base = len(tokens)
        seq = it["prompt"] + it["answer"]
        tokens += seq
        offsets.append(len(tokens))
        start = base + len(it["prompt"]) - 1
        n = len(it["answer"])
        tgt_pos += list(range(start, start + n))
        vals.append(it["vals"][:n])
        idxs.append(it["idxs"][:n])
    return {
        "tokens": torch.tensor(tokens, dtype=torch.int32),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "tgt_pos": torch.tensor(tgt_pos, dtype=torch.int64),
        "topk_val": torch.cat(vals).contiguous(),
        "topk_idx": torch.cat(idxs).contiguous(),
    }


def text_documents() -> list[str]:
    """Local text any machine has: Python stdlib source, /usr/share/doc text, man pages (macros stripped)."""
    docs: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        if "test" in p.parts[-2:][0] or p.name.startswith("test"):
            continue
        try:
            docs.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            pass
    for p in sorted(Path("/usr/share/doc").rglob("*")):
        if p.is_file() and (p.suffix in (".txt", ".md", ".rst") or p.name.startswith("README")):
            try:
                raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
                docs.append(raw.decode("utf-8"))
            except (UnicodeDecodeError, OSError, gzip.BadGzipFile):
                pass
    for p in sorted(Path("/usr/share/man/man1").glob("*.gz"))[:2000]:
        try:
            raw = gzip.decompress(p.read_bytes()).decode("utf-8")
        except (UnicodeDecodeError, OSError, gzip.BadGzipFile):
            continue
        lines = []
        for line in raw.splitlines():
            if line.startswith((".\\\"", "'\\\"")):
                continue
            line = re.sub(r"^\.[A-Za-z]+ ?", "", line)
            line = re.sub(r"\\f[BIRP]|\\-|\\&|\\\(..|\\e", lambda m: "-" if m.group() == "\\-" else "", line)
            if line.strip():
                lines.append(line)
        docs.append("\n".join(lines))
    return [d for d in docs if len(d) > 200]


def text_chunks(tok, seed: int = 99, max_chunks: int = 20000) -> list[list[int]]:
    """All local text, tokenized and cut into TEXT_CHUNK-token chunks, in a fixed shuffled order."""
    cache = WORK / "text_chunks.safetensors"
    if cache.exists():
        flat = load_file(str(cache))["chunks"]
        return flat.tolist()
    docs = text_documents()
    random.Random(seed).shuffle(docs)
    chunks: list[list[int]] = []
    for d in docs:
        if len(chunks) >= max_chunks:
            break  # more than a long run can use; tokenizing all of it would only cost time
        ids = tok(d, add_special_tokens=False)["input_ids"]
        for i in range(0, len(ids) - TEXT_CHUNK + 1, TEXT_CHUNK):
            chunks.append(ids[i:i + TEXT_CHUNK])
    random.Random(seed).shuffle(chunks)
    save_file({"chunks": torch.tensor(chunks, dtype=torch.int32)}, str(cache))
    return chunks


@torch.inference_mode()
def teacher_text_batch(model, chunks: list[list[int]]) -> dict[str, torch.Tensor]:
    """Teacher top-K logits at every position of each text chunk (one prefill pass)."""
    ids = torch.tensor(chunks, dtype=torch.long)
    logits = model(input_ids=ids).logits[:, :-1].float()
    v, i = logits.topk(TOP_K, dim=-1)
    items = [{"prompt": [], "answer": c, "vals": v[r], "idxs": i[r].int()} for r, c in enumerate(chunks)]
    # A text chunk has teacher data from its first token on: treat it as an "answer" with a 1-token prompt.
    for it in items:
        it["prompt"], it["answer"] = it["answer"][:1], it["answer"][1:]
        it["vals"] = it["vals"].half()
    return pack_items(items)


@torch.inference_mode()
def make_heldout(model, tok) -> None:
    """The target's greedy continuation (bf16, MAX_NEW tokens) of every held-out prompt."""
    if HELDOUT.exists():
        return
    prompts = [json.loads(x)["prompt"] for x in HELD_OUT_PROMPTS.read_text().splitlines() if x.strip()]
    items = []
    for i in range(0, len(prompts), 12):
        items += generate_batch(model, tok, prompts[i:i + 12])
    save_file(pack_items(items), str(HELDOUT))


def cmd_gen(args: argparse.Namespace) -> int:
    """Generate teacher shards until --minutes run out; resumes by skipping shards that exist."""
    from training_prompts import training_prompts

    torch.set_num_threads(threads())
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tok = load_tokenizer()
    model = load_target(torch.bfloat16)
    make_heldout(model, tok)
    prompts = training_prompts()
    chunks = text_chunks(tok)
    # Chat shards are named by their first prompt's index, so a run with another --batch resumes cleanly.
    n_chat = len(prompts)
    n_text = math.ceil(len(chunks) / args.text_batch)
    chat_i, text_i = args.from_prompt, 0
    while time.time() - t0 < args.minutes * 60:
        while chat_i < n_chat and (DATA_DIR / f"chat-{chat_i:05d}.safetensors").exists():
            chat_i += len(load_file(str(DATA_DIR / f"chat-{chat_i:05d}.safetensors"))["offsets"]) - 1
        while text_i < n_text and (DATA_DIR / f"text-{text_i:05d}.safetensors").exists():
            text_i += 1
        # Interleave: chat answers are what the draft must mimic; text keeps it general. Prefill is
        # cheap, so a text shard every `text_every` chat shards costs little generation time.
        n_chat_done = len(list(DATA_DIR.glob("chat-*.safetensors")))
        do_text = text_i < n_text and (chat_i >= n_chat or n_chat_done >= (text_i + 1) * args.text_every)
        if chat_i >= n_chat and text_i >= n_text:
            break
        t1 = time.time()
        if do_text:
            name = f"text-{text_i:05d}"
            shard = teacher_text_batch(model, chunks[text_i * args.text_batch:(text_i + 1) * args.text_batch])
        else:
            name = f"chat-{chat_i:05d}"
            shard = pack_items(generate_batch(model, tok, prompts[chat_i:chat_i + args.batch]))
        tmp = DATA_DIR / f".{name}.tmp"
        save_file(shard, str(tmp))
        os.replace(tmp, DATA_DIR / f"{name}.safetensors")
        dt = time.time() - t1
        n = int(shard["tgt_pos"].numel())
        log({"event": "shard", "name": name, "targets": n, "seconds": round(dt, 1),
             "tokens_per_s": round(n / dt, 1)})
    log({"event": "gen-stop", "minutes": round((time.time() - t0) / 60, 1)})
    return 0


# ----------------------------------------------------------------------------------------------------
# Training


class Corpus:
    """All shards in memory as sequences with teacher targets; reloads new shards on refresh()."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.seqs: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]] = {
            "chat": [], "text": []}
        self.targets = {"chat": 0, "text": 0}

    def refresh(self) -> int:
        new = 0
        for p in sorted(DATA_DIR.glob("*.safetensors")):
            if p.name in self.loaded:
                continue
            kind = p.name.split("-")[0]
            d = load_file(str(p))
            offs = d["offsets"].tolist()
            pos = d["tgt_pos"]
            for a, b in zip(offs[:-1], offs[1:]):
                sel = ((pos >= a) & (pos < b)).nonzero().squeeze(1)
                if sel.numel() == 0:
                    continue
                self.seqs[kind].append((d["tokens"][a:b].long(), pos[sel] - a, d["topk_val"][sel],
                                        d["topk_idx"][sel].long()))
                self.targets[kind] += int(sel.numel())
            self.loaded.add(p.name)
            new += 1
        return new

    def batch(self, rng: random.Random, token_budget: int, chat_frac: float):
        """Sample sequences up to token_budget tokens; returns padded ids and flat target tensors."""
        picked = []
        total = 0
        while total < token_budget:
            kind = "chat" if (not self.seqs["text"] or (self.seqs["chat"] and rng.random() < chat_frac)) else "text"
            s = rng.choice(self.seqs[kind])
            picked.append(s)
            total += len(s[0])
        width = max(len(s[0]) for s in picked)
        ids = torch.full((len(picked), width), 2, dtype=torch.long)
        rows, cols, vals, idxs = [], [], [], []
        for r, (toks, pos, v, i) in enumerate(picked):
            ids[r, :len(toks)] = toks
            rows.append(torch.full_like(pos, r))
            cols.append(pos)
            vals.append(v)
            idxs.append(i)
        return ids, torch.cat(rows), torch.cat(cols), torch.cat(vals).float(), torch.cat(idxs)


def distill_loss(model, ids, rows, cols, tvals, tidx, ce_weight: float, negatives: int = 0):
    """KL(teacher top-K renormalised || draft) + ce_weight * CE to the teacher's argmax.

    With negatives > 0 the softmax runs over a sampled vocabulary (every teacher top-K token in the
    batch plus `negatives` uniform random ones) instead of all 49152: the full-vocabulary head and its
    softmax are ~90% of a training step on this CPU, and the batch's candidates hold nearly all of the
    teacher's probability mass; the random ones keep pushing the rest of the vocabulary down."""
    hidden = model.model(input_ids=ids).last_hidden_state
    h = hidden[rows, cols]  # only positions with teacher data go through the head
    weight = model.lm_head.weight
    if negatives > 0:
        vocab = weight.shape[0]
        cand = torch.unique(torch.cat([tidx.flatten(), torch.randint(0, vocab, (negatives,))]))
        logits = h @ weight[cand].t()
        tpos = torch.searchsorted(cand, tidx)
    else:
        logits = h @ weight.t()
        tpos = tidx
    logq = logits.log_softmax(-1)
    p = tvals.softmax(-1)
    kl = (p * (p.clamp_min(1e-9).log() - logq.gather(1, tpos))).sum(-1).mean()
    ce = -logq.gather(1, tpos[:, :1]).mean()
    agree = (logits.argmax(-1) == tpos[:, 0]).float().mean()
    return kl + ce_weight * ce, kl.detach(), agree.detach()


@torch.inference_mode()
def heldout_acceptance(model, k: int = 4) -> dict:
    """Greedy acceptance along the target's held-out continuations, and a k-token loop's yield."""
    d = load_file(str(HELDOUT))
    offs = d["offsets"].tolist()
    pos = d["tgt_pos"]
    tidx = d["tokens"].long()[pos + 1]  # the target's greedy tokens themselves
    match_all: list[bool] = []
    per_prompt = []
    runs: list[list[bool]] = []
    for a, b in zip(offs[:-1], offs[1:]):
        sel = ((pos >= a) & (pos < b)).nonzero().squeeze(1)
        ids = d["tokens"][a:b].long()[None]
        logits = model(input_ids=ids).logits[0, pos[sel] - a]
        m = (logits.argmax(-1) == tidx[sel]).tolist()
        match_all += m
        runs.append(m)
        per_prompt.append(round(sum(m) / max(1, len(m)), 3))
    by_k = {kk: loop_yield(runs, kk) for kk in range(1, 6)}
    return {"acceptance": round(sum(match_all) / len(match_all), 4), "k": k,
            "tokens_per_pass": by_k[k][0], "loop_acceptance": by_k[k][1],
            "tokens_per_pass_by_k": {kk: v[0] for kk, v in by_k.items()}, "per_prompt": per_prompt}


def loop_yield(runs: list[list[bool]], k: int) -> tuple[float, float]:
    """Tokens per target pass and draft acceptance of a greedy k-token speculative loop.

    Exact under teacher forcing: drafts are accepted while they match, then the target's pass adds
    one token of its own."""
    tokens = passes = accepted = drafted = 0
    for m in runs:
        i = 0
        while i < len(m):
            n = 0
            while n < k and i + n < len(m) and m[i + n]:
                n += 1
            drafted += min(k, len(m) - i)
            accepted += n
            i += n + 1
            passes += 1
        tokens += len(m)
    return round(tokens / passes, 3), round(accepted / max(1, drafted), 4)


def cmd_train(args: argparse.Namespace) -> int:
    """Train the draft for --minutes of wall time, resuming from the last checkpoint if any."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads())
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    while not HELDOUT.exists() or not any(DATA_DIR.glob("chat-*.safetensors")):
        if time.time() - t_start > args.minutes * 60:
            return 1
        time.sleep(20)  # `gen` has not written its first shard yet
    model = AutoModelForCausalLM.from_pretrained(str(INIT_DIR), dtype=torch.float32)
    if args.init and not (CKPT_DIR / "last.pt").exists():
        # Continue from an exported draft (e.g. the committed demo/draft) when its checkpoints are gone.
        model.load_state_dict(AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32).state_dict())
        log({"event": "init", "from": args.init})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    state = {"step": 0, "train_s": 0.0, "best": -1.0, "tokens_seen": 0}
    last = CKPT_DIR / "last.pt"
    if last.exists():
        ck = torch.load(last, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        log({"event": "resume", **state})
    rng = random.Random(state["step"] + 17)
    corpus = Corpus()
    corpus.refresh()
    t_run = time.time()
    t_ckpt = t_refresh = t_eval = t_run
    budget = args.minutes * 60
    first_eval = state["step"] == 0

    def save(best: bool) -> None:
        tmp = CKPT_DIR / "last.pt.tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)
        os.replace(tmp, last)
        if best:
            torch.save({"model": model.state_dict(), "state": state}, CKPT_DIR / "best.pt.tmp")
            os.replace(CKPT_DIR / "best.pt.tmp", CKPT_DIR / "best.pt")

    def evaluate() -> None:
        model.eval()
        res = heldout_acceptance(model, k=args.k)
        model.train()
        is_best = res["acceptance"] > state["best"]
        if is_best:
            state["best"] = res["acceptance"]
        log({"event": "eval", "step": state["step"], "train_minutes": round(state["train_s"] / 60, 2),
             "tokens_seen": state["tokens_seen"], "chat_targets": corpus.targets["chat"],
             "text_targets": corpus.targets["text"], **res})
        save(is_best)

    if first_eval:
        evaluate()
    running = {"loss": 0.0, "kl": 0.0, "agree": 0.0, "n": 0}
    while True:
        now = time.time()
        elapsed = now - t_run
        if elapsed >= budget:
            break
        frac = elapsed / budget
        warm = min(1.0, (state["step"] + 1) / args.warmup)
        # Constant LR, then a cosine decay over the last fifth of this run's budget.
        decay = 1.0 if frac < 0.8 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (frac - 0.8) / 0.2))
        for g in opt.param_groups:
            g["lr"] = args.lr * warm * decay
        ids, rows, cols, tv, ti = corpus.batch(rng, args.tokens, args.chat_frac)
        t1 = time.time()
        loss, kl, agree = distill_loss(model, ids, rows, cols, tv, ti, args.ce_weight, args.negatives)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["train_s"] += time.time() - t1
        state["step"] += 1
        state["tokens_seen"] += int(rows.numel())
        running["loss"] += float(loss)
        running["kl"] += float(kl)
        running["agree"] += float(agree)
        running["n"] += 1
        if state["step"] % args.log_every == 0:
            n = running["n"]
            log({"event": "train", "step": state["step"], "lr": round(opt.param_groups[0]["lr"], 6),
                 "loss": round(running["loss"] / n, 4), "kl": round(running["kl"] / n, 4),
                 "train_agree": round(running["agree"] / n, 4), "train_minutes": round(state["train_s"] / 60, 2)})
            running = {"loss": 0.0, "kl": 0.0, "agree": 0.0, "n": 0}
        now = time.time()
        if now - t_refresh > 120:
            if corpus.refresh():
                log({"event": "data", "chat_seqs": len(corpus.seqs["chat"]), "text_seqs": len(corpus.seqs["text"]),
                     **{f"{k}_targets": v for k, v in corpus.targets.items()}})
            t_refresh = now
        if now - t_eval > args.eval_minutes * 60:
            evaluate()
            t_eval = t_ckpt = time.time()
        elif now - t_ckpt > args.ckpt_minutes * 60:
            save(False)
            t_ckpt = now
    evaluate()
    log({"event": "train-stop", **state})
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Print the held-out acceptance of a checkpoint (best by default) or of a draft directory."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads())
    if args.draft:
        model = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(INIT_DIR), dtype=torch.float32)
        model.load_state_dict(torch.load(CKPT_DIR / args.ckpt, weights_only=False)["model"])
    model.eval()
    print(json.dumps(heldout_acceptance(model, k=args.k)))
    return 0


def cmd_curve(args: argparse.Namespace) -> int:
    """Print held-out acceptance over training time from the log, one row per evaluation."""
    print("train_min  step  chat_targets  text_targets  acceptance  tokens_per_pass(k)")
    for line in LOG.read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "eval":
            print(f"{e['train_minutes']:9.1f} {e['step']:5d} {e['chat_targets']:13d} {e['text_targets']:13d}"
                  f" {e['acceptance']:11.4f}  {e['tokens_per_pass']:.3f} ({e['k']})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="generate teacher data shards")
    g.add_argument("--minutes", type=float, default=90)
    g.add_argument("--batch", type=int, default=64, help="prompts per chat shard (one generate call)")
    g.add_argument("--text-batch", type=int, default=32, help="text chunks per text shard")
    g.add_argument("--from-prompt", type=int, default=0,
                   help="first training prompt to answer (a later session's new data starts past the old)")
    g.add_argument("--text-every", type=int, default=2, help="chat shards per text shard")
    t = sub.add_parser("train", help="train the draft")
    t.add_argument("--minutes", type=float, default=90)
    t.add_argument("--init", default=None, help="start from this draft directory when there is no checkpoint")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=int, default=30)
    t.add_argument("--tokens", type=int, default=3072, help="tokens per batch")
    t.add_argument("--chat-frac", type=float, default=0.7, help="share of sequences drawn from chat shards")
    t.add_argument("--ce-weight", type=float, default=0.2)
    t.add_argument("--negatives", type=int, default=4096,
                   help="sampled-softmax negatives per step (0: full 49152-token softmax)")
    t.add_argument("--k", type=int, default=4, help="draft length for the simulated loop")
    t.add_argument("--eval-minutes", type=float, default=5)
    t.add_argument("--ckpt-minutes", type=float, default=3)
    t.add_argument("--log-every", type=int, default=20)
    e = sub.add_parser("eval", help="held-out acceptance")
    e.add_argument("--ckpt", default="best.pt")
    e.add_argument("--draft", default=None, help="a draft directory instead of a checkpoint")
    e.add_argument("--k", type=int, default=4)
    sub.add_parser("curve", help="held-out acceptance over training time, from the log")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    return {"gen": cmd_gen, "train": cmd_train, "eval": cmd_eval, "curve": cmd_curve}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
