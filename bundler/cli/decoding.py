"""`bundle run`, `bench` and `tune`: decode with a verified pair, measure it, tune its settings."""

from __future__ import annotations

__all__ = ["run", "bench", "replay", "tune"]

import sys
from pathlib import Path
from typing import Any

import click

from bundler.cli.app import command, identity_options, emit, fail, main, password, trusted
from bundler.cli.options import device_option, memory_budget_option
from bundler.cli.render import format_stats, print_bench, print_tune
from bundler.store.layout import Store
from bundler.store.refs import parse_ref
from bundler.trust import keys
from core.errors import BundleError


@main.command()
@click.argument("ref")
@click.option("--prompt", help="The prompt (the chat template is applied unless --raw); `-` reads standard input, as does no --prompt with piped input.")
@click.option("--prompt-file", type=click.Path(dir_okay=False), help="Read the prompt from this file.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1, 1 << 20))
@click.option("--draft-tokens", type=click.IntRange(1, 64), help="Tokens drafted per step (default: the bundle's).")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0.0), help="0 is greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True))
@click.option("--seed", type=int, help="Seed for sampling (reproducible).")
@click.option("--raw", is_flag=True, help="Skip the chat template.")
@click.option("--device", callback=device_option, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Default: the bundle's; a bf16 bundle runs in float32 on a CPU whose bf16 products measure slower.")
@click.option("--memory-budget", callback=memory_budget_option, help="What the pair may use, like 300MB or 2GiB (default: available memory).")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable); also $BUNDLE_TRUSTED_KEYS.")
@click.option("--attest", "attest_key", type=click.Path(), help="Private key (P-256): sign a run record into the store when the run finishes.")
@click.option("--attest-prompts", is_flag=True, help="With --attest: put the sha256 of the prompt and output in the record (never their text).")
@click.option("--reproducible", is_flag=True, help="Greedy tokens that do not depend on what else shares a pass (batch-invariant forward; compact torch models only; docs/serving.md).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@identity_options
@command
def run(store: Store, ref: str, prompt: str | None, prompt_file: str | None, key_paths: tuple[str, ...], ca_paths: tuple[str, ...], identities: tuple[str, ...], issuers: tuple[str, ...], as_json: bool, attest_key: str | None, attest_prompts: bool, **options: Any) -> None:
    """Verify the bundle and the tokenizer match, then decode speculatively (losslessly)."""
    from bundler.verbs.run import run_bundle

    parsed = parse_ref(ref)
    from bundler.verbs.prompts import read_prompt

    prompt = read_prompt(prompt, prompt_file)
    if attest_prompts and not attest_key:
        raise BundleError("usage", "--attest-prompts needs --attest KEY")
    attest = keys.load_private_key(Path(attest_key), password()) if attest_key else None  # fail before running
    stream = None if as_json else (lambda text: click.echo(text, nl=False))
    try:
        result = run_bundle(store, parsed, trusted(key_paths, ca_paths, identities, issuers), prompt, on_text=stream, attest=attest, attest_prompts=attest_prompts, **options)
    except BundleError as err:
        if as_json:
            fail(err, as_json=True, extra={"bundle": {"ref": ref}})
        raise
    if as_json:
        emit(result)
    else:
        click.echo()
        click.echo(format_stats(result["stats"], result.get("timings")), err=True)
        if result.get("attestation"):
            click.echo(f"run record {result['attestation']['digest']} signed by {result['attestation']['key_id'][:16]}…", err=True)


@main.command()
@click.argument("record")
@click.option("--prompt", help="The recorded request's prompt (`-`: standard input); tokenized as the request was, it must have the sha256 the record signed.")
@click.option("--prompt-file", type=click.Path(dir_okay=False), help="Read the prompt from this file.")
@click.option("--tokens", "tokens_file", type=click.Path(dir_okay=False), help="The recorded output (`run --json`'s output or a JSON list of ids): where a replay parts from it.")
@click.option("--device", callback=device_option, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key, of the record's signer and the bundle's (repeatable); also $BUNDLE_TRUSTED_KEYS.")
@identity_options
@command
def replay(store: Store, record: str, prompt: str | None, prompt_file: str | None, tokens_file: str | None, device: str | None,
           key_paths: tuple[str, ...], ca_paths: tuple[str, ...], identities: tuple[str, ...], issuers: tuple[str, ...]) -> None:
    """Decode a signed run record's request again (RECORD: its digest, from `bundle attestations`) and say, as JSON,
    whether the tokens are the ones it signed: exit 0 when they are, 3 when not (docs/running.md)."""
    from bundler.verbs.prompts import read_prompt
    from bundler.verbs.replay import ReplayRequest, reference_tokens, replay_record

    request = ReplayRequest(read_prompt(prompt, prompt_file), device, reference_tokens(tokens_file) if tokens_file else None)
    report = replay_record(store, record, trusted(key_paths, ca_paths, identities, issuers), request)
    emit(report)
    if not report["match"]:
        err = BundleError("replay-mismatch", f"the replay's {report['tokens']} tokens are not the {report['recorded_tokens']} the record "
                                             f"signed ({report['mode']} mode)")
        click.echo(err.line(), err=True)
        sys.exit(err.exit_code)


@main.command()
@click.argument("ref")
@click.option("--prompts", "prompts_file", metavar="open|grounded|FILE",
              help="A shipped prompt set (open: open questions; grounded: held-out edit, rewrite, extract, answer-from-text and "
                   "multi-turn tasks) or a file: JSON lines {\"prompt\": ..., \"category\": ...} or one prompt a line.  [default: open]")
@click.option("--limit", type=click.IntRange(1), help="Use only the first N prompts.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--draft-tokens", type=click.IntRange(1, 64), help="Default: the bundle's; a bf16 bundle runs in float32 on a CPU whose bf16 products measure slower.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 20), help="Rounds over the prompts; speed-ups are their medians.")
@click.option("--device", callback=device_option, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@command
def bench(store: Store, ref: str, prompts_file: str | None, limit: int | None, key_paths: tuple[str, ...], as_json: bool, **options: Any) -> None:
    """Target alone, transformers' assisted generation and `bundle run`: same pair, same prompts, one process.

    A GGUF bundle: our plain decoding, llama-cpp-python's own generation of the target file and `bundle run`."""
    from bundler.verbs.run import bench_bundle
    from runner.bench.prompt_sets import read_prompts

    prompts = read_prompts(prompts_file)[:limit]
    say = None if as_json else (lambda msg: click.echo(f"… {msg}", err=True))
    result = bench_bundle(store, parse_ref(ref), trusted(key_paths), [p.text for p in prompts], progress=say,
                          categories=[p.category for p in prompts], **options)
    if as_json:
        emit(result)
        return
    print_bench(result)


@main.command()
@click.argument("target")
@click.option("--prompts", "prompts_file", metavar="SET|FILE",
              help="Prompts to tune on: a shipped set (open, grounded-tuning) or a file of JSON lines {\"prompt\": ...} or one prompt a line; "
                   "from a file, every third prompt is held out for the check.  [default: grounded-tuning, checked on grounded]")
@click.option("--held-out", metavar="SET|FILE|none", help="Prompts for the held-out check instead (none: no check).")
@click.option("--draft", "drafts", multiple=True, type=click.Path(exists=True, file_okay=False), help="A candidate draft model directory (repeatable).")
@click.option("--max-k", default=8, show_default=True, type=click.IntRange(1, 32), help="Try proposal lengths 1..N.")
@click.option("--limit", type=click.IntRange(1), help="Use only the first N prompts of each set.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 20), help="Rounds over the prompts, pooled.")
@click.option("--device", callback=device_option, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("-f", "--file", "kitfile", type=click.Path(dir_okay=False), help="The context's Kitfile, when not CONTEXT/Kitfile.")
@click.option("--write", is_flag=True, help="Put the chosen settings into the context's Kitfile (a context only).")
@click.option("--key", "key_paths", multiple=True, type=click.Path(), help="Trusted public key (repeatable; a stored bundle).")
@click.option("--json", "as_json", is_flag=True, help="The table and the choice as one JSON object on stdout.")
@command
def tune(store: Store, target: str, prompts_file: str | None, held_out: str | None, drafts: tuple[str, ...], max_k: int, limit: int | None,
         max_new_tokens: int, repeat: int, device: str | None, kitfile: str | None, write: bool, key_paths: tuple[str, ...],
         as_json: bool) -> None:
    """Measure each speculation method, draft length and candidate draft on TARGET (a context directory
    before `pack`, or a stored bundle REF, verified as `run` verifies it): acceptance per position and
    tokens/s on this machine; print the table and the choice, checked on held-out prompts."""
    from bundler.verbs.tune import TuneOptions, split_held_out, tune_bundle, tune_context, tune_target
    from runner.bench.prompt_sets import read_prompts

    where = tune_target(store, target)  # a directory that is also a stored reference: refused as ambiguous
    is_context = isinstance(where, Path)
    if write and not is_context:
        raise BundleError("usage", "--write needs a context directory; a stored bundle is signed as it is")
    prompts = [p.text for p in read_prompts(prompts_file, default="grounded-tuning")]
    if held_out == "none":
        held = []
    elif held_out or not prompts_file:
        held = [p.text for p in read_prompts(held_out, default="grounded")]
    else:
        prompts, held = split_held_out(prompts)
    say = None if as_json else (lambda msg: click.echo(f"… {msg}", err=True))
    options = TuneOptions(prompts[:limit], held[:limit], tuple(Path(d) for d in drafts), tuple(range(1, max_k + 1)), max_new_tokens, repeat,
                          device, say)
    if is_context:
        result = tune_context(where, options, write=write, kitfile=Path(kitfile) if kitfile else None)
    else:
        result = tune_bundle(store, where, trusted(key_paths), options)
    if as_json:
        emit(result)
        return
    print_tune(result)
