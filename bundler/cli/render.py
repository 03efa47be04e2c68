"""Reports shown as text: run statistics, bench and tune tables, run records."""

from __future__ import annotations

__all__ = ["format_record", "format_stats", "print_bench", "print_tune"]

import json
from typing import Any

from core.display import shown


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def format_stats(stats: dict[str, Any], timings: dict[str, Any] | None = None) -> str:
    lines = [
        f"{stats['new_tokens']} tokens in {stats.get('elapsed_s', 0):.2f} s: {stats['tokens_per_second']:.1f} tokens/s, "
        f"{stats['target_passes']} target passes",
        # Nothing is drafted when the answer ends before the first draft (--max-new-tokens 1): no rate to show.
        f"acceptance {_rate(stats['acceptance_rate'])} ({stats['accepted']}/{stats['drafted']} drafted), mean accepted length {_rate(stats['mean_accepted_length'])}",
    ]
    per_pos = stats.get("per_position_acceptance")
    if per_pos:
        lines.append("per position: " + " ".join(_rate(a) for a in per_pos))
    if stats.get("fallback"):
        fb = stats["fallback"]
        lines.append(f"fallback to plain decoding at token {fb.get('at_token')}: {fb.get('reason')}")
    if timings:
        names = ("verify_s", "extract_s", "load_s", "prefill_s", "decode_s", "first_token_s")
        lines.append("timings: " + ", ".join(f"{n[:-2].replace('_', ' ')} {timings[n]:.2f} s" for n in names if isinstance(timings.get(n), (int, float))))
    return "\n".join(lines)


def print_bench(result: dict[str, Any]) -> None:
    """bench's report as tables: the runs, the headline figures, each category, each prompt, what differed."""
    from rich.console import Console
    from rich.table import Table

    table = Table("run", "tokens/s", "new tokens", "seconds")
    for name, run in result["runs"].items():
        if run is None:  # hf_assisted on a GGUF bundle: transformers does not run GGUF files
            table.add_row(name, "n/a", "-", "-")
            continue
        table.add_row(name, f"{run['tokens_per_second']:.1f}", str(run["new_tokens"]), f"{run['seconds']:.2f}")
    console = Console()
    console.print(table)
    for key in ("speedup_vs_target", "speedup_vs_runner_plain", "speedup_vs_hf_assisted", "speedup_vs_hf_prompt_lookup",
                "speedup_vs_llama_cpp_python", "plain_vs_llama_cpp_python",
                "speedup_vs_fastest_plain", "acceptance_rate", "per_token_acceptance",
                "mean_accepted_length", "cost_ratio", "verify_cost_ratio", "theoretical_speedup", "efficiency", "break_even_acceptance", "identical_output",
                "runner_plain_identical"):
        if key in result:
            console.print(f"{key:<28} {result[key]}")
    categories = Table("category", "prompts", "tokens/s", "x our plain", "x peers", "method chosen")
    for name, c in result.get("categories", {}).items():
        peers = ", ".join(f"{key.removeprefix('speedup_vs_')} {value:.2f}" for key, value in c.items()
                          if key.startswith("speedup_vs_") and value is not None and key not in ("speedup_vs_runner_plain", "speedup_vs_target_only"))
        ours = c.get("speedup_vs_runner_plain", c.get("speedup_vs_target_only"))
        categories.add_row(name, str(c["prompts"]), f"{c['tokens_per_second']['bundle']:.1f}", "-" if ours is None else f"{ours:.2f}", peers,
                           ", ".join(f"{m} {n}" for m, n in c["methods"].items()))
    console.print(categories)
    per_prompt = Table("prompt", "tokens", "x target", "x our plain", "acceptance", "accepted/pass", "fallback at", "method")
    for p in result["per_prompt"]:
        per_prompt.add_row(str(p["prompt"]), str(p["new_tokens"]), f"{p['speedup_vs_target']:.2f}", f"{p['speedup_vs_runner_plain']:.2f}",
                           f"{p['per_token_acceptance']:.2f}",
                           f"{p['mean_accepted_length']:.2f}", "-" if p["fallback_at"] is None else str(p["fallback_at"]), p.get("method", "-"))
    console.print(per_prompt)
    for d in result["differences"]:
        if "gap_in_theirs" in d:  # GGUF: against llama-cpp-python's own greedy generation
            gaps = f"logits apart: {d['gap_in_theirs']} in theirs, {d['gap_in_ours']} in ours"
            console.print(f"prompt {d['prompt']}: differs from llama-cpp-python at token {d['position']} (tie: {d['tie']}; {gaps})")
            continue
        gaps = f"bf16 steps apart: {d.get('target_alone_gap_bf16_steps')} target alone, {d.get('bundle_pass_gap_bf16_steps')} in the bundle's pass"
        console.print(f"prompt {d['prompt']}: differs from the target alone at token {d['position']} (tie: {d['tie']}; {gaps})")
    for f in result["fallbacks"]:
        console.print(f"prompt {f['prompt']}: fell back at token {f['at_token']}: {f['reason']}")


def print_tune(result: dict[str, Any]) -> None:
    """tune's table (every setting), the choice and the held-out check."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for title, rows in (("tuning prompts", result["rows"]), ("held-out prompts", result["held_out_rows"] or [])):
        table = Table("setting", "tokens/s", "x plain", "acceptance", "acceptance by position", title=title)
        for r in rows:
            table.add_row(r["setting"], f"{r['tokens_per_second']:.1f}", "-" if r["speedup_vs_plain"] is None else f"{r['speedup_vs_plain']:.2f}",
                          f"{r['per_token_acceptance']:.2f}", " ".join(f"{a:.2f}" for a in r["acceptance_at"]))
        if rows:
            console.print(table)
    choice = result["choice"]
    console.print(f"choice: {choice['setting']} ({choice['tokens_per_second']:.1f} tokens/s, {choice['speedup_vs_plain']}x plain)"
                  + (" — plain decoding was faster on these prompts; the guard falls back to it" if result["plain_fastest"] else ""))
    check = result["held_out"]
    if check:
        verdict = "within" if check["within_tolerance"] else "NOT within"
        console.print(f"held out: the choice {check['choice_tokens_per_second']:.1f} tokens/s, best there {check['best']} "
                      f"{check['best_tokens_per_second']:.1f}: {check['share_of_best']:.1%} of it, {verdict} {check['tolerance']:.0%}")
    console.print(f"settings: {json.dumps(result['settings'])}" + (f" written to {result['written']}" if result.get("written") else ""))


def format_record(record: Any) -> str:
    """One record: a verified one as one row (verdict, signer, time range, engine, totals); one that did not verify
    as FAIL with its reason, its claims on an indented line marked as not checked. Every field is escaped
    (core.display), so no statement can draw a row of its own."""
    predicate = (record.statement or {}).get("predicate") if isinstance(record.statement, dict) else None
    p = predicate if isinstance(predicate, dict) else {}
    totals = p.get("totals") if isinstance(p.get("totals"), dict) else {}
    rate = totals.get("acceptance_rate")
    fields = (
        f"{shown(p.get('started', '?'))} .. {shown(p.get('finished', '?'))}  "
        f"{shown(p.get('kind', '?'))} {shown(p.get('engine', '?'))}/{shown(p.get('device', '?'))}/{shown(p.get('dtype', '?'))}  "
        f"requests {shown(totals.get('requests', '?'))} tokens {shown(totals.get('tokens', '?'))} "
        f"accepted {shown(totals.get('accepted', '?'))}/{shown(totals.get('drafted', '?'))}"
        f" ({f'{rate:.2f}' if isinstance(rate, float) else '-'}) fallbacks {shown(totals.get('fallbacks', '?'))}"
    )
    if record.verified:
        return f"ok   {record.digest[:19]}…  signer {shown(record.signer[:16])}  {fields}"
    reason = record.error.line() if record.error is not None else "error: [integrity] not verified"
    claimed = shown(record.claimed_signer[:16]) if record.claimed_signer else "-"
    return f"FAIL {record.digest[:19]}…  NOT VERIFIED: {shown(reason, 1000)}\n     claimed, not checked: key {claimed}  {fields}"
