"""Chat templates are bounded (issue #24 item 3): every render goes through runner.models.chat_template, within
limits on steps (loop iterations), time and sizes; over a limit, and on a sandbox violation, a clean
[invalid-bundle] refusal: exit 6 from `bundle run`, a 400 from a real `bundle serve`, which stays responsive."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import run_bundle
from runner.models.chat_template import MAX_TEMPLATE_CHARS, TemplateRefused, render
from test_serve import REF, Server
from tests.tinymodels import CHAT_TEMPLATE, make_pair

HI = [{"role": "user", "content": "hi"}]
NESTED_LOOPS = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "nested loops": NESTED_LOOPS,
    "nested loops that print nothing but a space": "{% for a in range(99999) %}{% for b in range(99999) %}{{ '' }}{% endfor %}{% endfor %}",
    "a huge repetition": "{{ 'x' * 10**10 }}",
    "a huge list repetition": "{{ (messages * 10**9)|length }}",
    "an integer power": "{{ (2 ** 100000000)|string|length }}",
    "an integer square chain": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x > 0 }}",
    "doubling by ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling by +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "a shared list printed": "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = [ns.s, ns.s] %}{% endfor %}{{ ns.s }}",
    "a shared list through a filter": "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = [ns.s, ns.s] %}{% endfor %}{{ ns.s|tojson|length }}",
    "str.center": "{{ 'x'.center(10**10) }}",
    "the center filter": "{{ 'x'|center(10**10) }}",
    "the indent filter": "{{ ('a\\n' * 100000)|indent(100000) }}",
    "replace with an empty pattern": "{{ ('x' * 100000)|replace('', 'y' * 100000) }}",
    "a % format width": "{{ '%999999999d' % 1 }}",
    "a % format star width": "{{ '%*d' % (999999999, 1) }}",
    "a str.format width": "{{ '{:>999999999}'.format(1) }}",
    "a str.format nested width": "{{ '{:>{}}'.format(1, 999999999) }}",
    "the format filter width": "{{ '%999999999d'|format(1) }}",
    "tojson indent": "{{ messages|tojson(indent=10**9) }}",
    "output too large": "{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}",
    "macro recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "a macro calling itself twice, no loop": "{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
    "sandbox: class walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "sandbox: mutating the messages": "{{ messages.append(1) }}",
    "raise_exception": "{{ raise_exception('this template refuses') }}",
    "a syntax error": "{% for %}",
    "lipsum": "{{ lipsum(n=10**7) }}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_is_refused_cleanly(name: str) -> None:
    with pytest.raises(TemplateRefused) as err:
        render(HOSTILE[name], HI)
    assert err.value.code == "invalid-bundle" and err.value.exit_code == 6
    assert err.value.line().startswith("error: [invalid-bundle] chat template: ")


def test_the_step_bound_stops_a_loop_and_the_time_bound_stops_a_slow_one() -> None:
    with pytest.raises(TemplateRefused, match="steps"):
        render(NESTED_LOOPS, HI, max_steps=10_000)
    with pytest.raises(TemplateRefused, match="time limit"):
        render(NESTED_LOOPS, HI, max_steps=10**12, time_limit_s=0.2)


def test_a_template_longer_than_the_bound_is_refused_before_it_compiles() -> None:
    with pytest.raises(TemplateRefused, match="characters"):
        render("x" * (MAX_TEMPLATE_CHARS + 1), HI)


def test_ordinary_templates_render_as_before() -> None:
    assert render(CHAT_TEMPLATE, HI) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render(CHAT_TEMPLATE, HI, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    # transformers' environment: trim_blocks/lstrip_blocks, loopcontrols, tojson, named tokens, {% generation %}
    template = ("{{ bos_token }}{% for m in messages %}\n  {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
                "{% generation %}{{ m|tojson }}{% endgeneration %}{% endfor %}")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "é"}]
    assert render(template, messages, variables={"bos_token": "<s>"}) == '<s>{"role": "user", "content": "é"}'
    # What a user writes is data, not a format: percent signs, braces and large numbers pass through methods
    prices = [{"role": "user", "content": "50% off 99999999 {0:>99999999} %999999999d"}]
    template = "{% for m in messages %}{{ m['content'].strip()|trim ~ '|' ~ m['content'].upper() }}{% endfor %}"
    assert render(template, prices) == "50% off 99999999 {0:>99999999} %999999999d|50% OFF 99999999 {0:>99999999} %999999999D"
    # loops keep jinja2's loop variable, else branch and recursive loops through the step counter
    loops = "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if loop.last %}!{% endif %}{% else %}none{% endfor %}"
    assert render(loops, HI * 2) == "1/22/2!" and render(loops, []) == "none"
    assert render("{% for x in [1, [2, [3]]] recursive %}{{ loop(x) if x is iterable else x }}{% endfor %}", HI) == "123"
    big = [{"role": "user", "content": "y" * 500_000}]  # large messages are room, not abuse
    assert render(CHAT_TEMPLATE, big).count("y") == 500_000


def test_a_render_leaves_any_trace_function_in_place() -> None:
    """The bounds live in the template's rewritten syntax tree, not in a trace hook: debuggers and coverage see
    every render."""
    import sys

    def tracer(frame, event, arg):
        return None

    sys.settrace(tracer)
    try:
        render(CHAT_TEMPLATE, HI)
        with pytest.raises(TemplateRefused):
            render(NESTED_LOOPS, HI, max_steps=1000)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


# -- the CLI and the server on a bundle whose template is hostile -----------------------------------------
@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    """A signed tiny pair whose tokenizer_config.json carries a chat template that loops for hours."""
    base = tmp_path_factory.mktemp("hostile-template")
    paths = make_pair(base / "ctx", speculative={"draft_tokens": 3})
    config_path = paths["tokenizer"] / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = NESTED_LOOPS + CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    run_bundle("pack", str(base / "ctx"), "-t", REF, "--key", str(keypair[0]), "--store", str(base / "store"), check=True)
    return base / "store"


def test_bundle_run_refuses_a_hostile_template_with_exit_6_and_raw_still_runs(hostile_store: Path, keypair) -> None:
    args = ["run", REF, "--key", str(keypair[1]), "--store", str(hostile_store), "--max-new-tokens", "2"]
    refused = run_bundle(*args, "--prompt", "hi")
    assert refused.code == 6, refused.err
    assert refused.err.strip().splitlines()[-1].startswith("error: [invalid-bundle] chat template: ")
    assert "Traceback" not in refused.err
    assert run_bundle(*args, "--prompt", "hi", "--raw").code == 0


def test_serve_answers_400_for_a_hostile_template_and_health_stays_within_a_second(hostile_store: Path, keypair) -> None:
    server = Server(hostile_store, keypair[1])
    try:
        answers: list[httpx.Response] = []

        def chat() -> None:
            answers.append(httpx.post(server.url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 2}, timeout=120))

        clients = [threading.Thread(target=chat) for _ in range(3)]
        for c in clients:
            c.start()
        slowest, polls = 0.0, 0
        deadline = time.monotonic() + 120
        while any(c.is_alive() for c in clients) and time.monotonic() < deadline:  # /health while they render
            started = time.monotonic()
            assert httpx.get(server.url + "/health", timeout=5).status_code == 200
            assert httpx.get(server.url + "/metrics", timeout=5).status_code == 200
            slowest, polls = max(slowest, time.monotonic() - started), polls + 1
            time.sleep(0.05)
        for c in clients:
            c.join(5)
        assert polls > 0 and slowest < 1.0
        assert [a.status_code for a in answers] == [400, 400, 400]
        assert all(a.json()["error"]["code"] == "invalid_chat_template" for a in answers)
        done = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert done.status_code == 200  # the raw prompt needs no template: the server still serves
    finally:
        assert server.stop() == 0


# -- every place a template comes from goes through the bounded renderer ----------------------------------
def test_a_template_in_chat_template_jinja_through_transformers_is_bounded(tmp_path: Path) -> None:
    """chat_template.jinja sends the tokenizer to transformers' AutoTokenizer; its template is rendered here."""
    from runner.models.chat_template import chat_ids
    from runner.models.lean_tokenizer import LeanTokenizer, load_tokenizer
    from tests.tinymodels import train_tokenizer, write_tokenizer

    directory = write_tokenizer(tmp_path / "tok", train_tokenizer())
    (directory / "chat_template.jinja").write_text(NESTED_LOOPS)
    tokenizer = load_tokenizer(directory)
    assert not isinstance(tokenizer, LeanTokenizer)
    with pytest.raises(TemplateRefused, match="steps"):
        chat_ids(tokenizer, HI)
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    tokenizer = load_tokenizer(directory)
    want = tokenizer.apply_chat_template(HI, add_generation_prompt=True, tokenize=True)
    assert chat_ids(tokenizer, HI) == list(want["input_ids"] if hasattr(want, "keys") else want)  # transformers' own ids


def test_a_template_in_gguf_metadata_is_bounded(tmp_path: Path) -> None:
    """A GGUF file's tokenizer.chat_template (the file's own llama.cpp tokenizer, as gguf_run loads it)."""
    from runner.checks.gguf_header import read_header
    from runner.gguf_run import GGUFTokenizer
    from tests.tinygguf import write_gguf

    path = write_gguf(tmp_path / "model.gguf")
    tokenizer = GGUFTokenizer(path, read_header(path)["metadata"])
    tokenizer.llm.metadata["tokenizer.chat_template"] = NESTED_LOOPS  # as if the file carried it
    with pytest.raises(TemplateRefused, match="steps"):
        tokenizer.chat_ids(HI)
    with pytest.raises(TemplateRefused, match="steps"):
        tokenizer.prompt_ids("hi", raw=False)
    assert tokenizer.prompt_ids("hi", raw=True)  # raw never renders it
