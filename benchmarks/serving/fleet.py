"""A fleet through haproxy against one replica alone (mode `fleet`): pods run exactly as deploy/kubernetes says
(tests/fleet.py reads the commands from the YAML), the bundle pulled by each pod's init container from a real
docker-registry on loopback.

- baseline: one replica, 8 concurrent clients straight to it;
- fleet: three replicas behind Debian's haproxy (health-checking the readiness path), 8 concurrent clients;
- failure: the same fleet, one replica killed (SIGKILL) a third of the way through: requests that failed, the
  requests that were in flight on it when it died (haproxy's own count), and what the client saw for each.

Reported: aggregate throughput (completion tokens and requests per second of wall time), p50/p99 latency, the
ratios fleet/baseline, with the CPU named. On one machine the replicas share its cores: the ratio says what the
load balancer and the extra processes cost or gain there, not what three nodes would give. `--tiny`: the tiny
test pair, built here (quick), instead of the demo bundle.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from serving.common import ROOT, TORCH_REF, add_bundle_options, machine, read_prompt_set

sys.path.insert(0, str(ROOT / "tests"))  # the registry, the pods and haproxy of the fleet test

from registry_server import running_registry  # noqa: E402
from tests.fleet import Manifests, Pod, free_port, pod_volumes, start_haproxy, stopping  # noqa: E402

API_KEY = "bench-key"
CLIENTS = 8


def _publish(args: argparse.Namespace, work: Path, registry_host: str) -> tuple[str, Path]:
    """The bundle in the registry; returns its reference there and the trusted-keys directory."""
    from conftest import run_bundle

    keys = work / "trusted-keys"
    keys.mkdir()
    if args.tiny:
        from bundler.trust.keys import generate_keypair
        from tests.tinymodels import make_pair

        key, pub = generate_keypair(work / "signing")
        make_pair(work / "ctx")
        store, ref = work / "publisher", "tiny-spec:1.0.0"
        run_bundle("pack", str(work / "ctx"), "-t", ref, "--key", str(key), "--store", str(store), check=True)
    else:
        store, ref, pub = Path(args.store), args.ref, Path(args.key)
    (keys / "bundle.pub").write_bytes(pub.read_bytes())
    name = ref.split("/")[-1]
    dest = f"{registry_host}/models/{name}"
    run_bundle("push", ref, dest, "--plain-http", "--store", str(store), env={"DOCKER_CONFIG": str(work)}, check=True)
    return dest, keys


def _pods(work: Path, names: list[str], ref: str, keys: Path, manifests: Manifests) -> list[Pod]:
    (work / "registry-auth").mkdir(parents=True, exist_ok=True)
    (work / "registry-auth" / "config.json").write_text('{"auths": {}}')
    (work / "api-key").mkdir(exist_ok=True)
    (work / "api-key" / "key").write_text(API_KEY + "\n")
    pods = []
    for name in names:
        workdir = work / "pods" / name
        workdir.mkdir(parents=True)
        volumes = pod_volumes(workdir, keys, work / "registry-auth", work / "api-key")
        pods.append(Pod(name, free_port(), workdir, manifests, volumes, {"BUNDLE_REF": ref, "BUNDLE_PLAIN_HTTP": "1"}))
    return pods


def _request(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    start = time.perf_counter()
    try:
        r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600)
        seen = r.status_code if r.status_code != 200 else "ok"
        tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
        detail = "" if r.status_code == 200 else r.text[:120]
    except httpx.HTTPError as exc:
        seen, tokens, detail = type(exc).__name__, 0, str(exc)[:120]
    return {"seen": seen, "tokens": tokens, "latency_s": time.perf_counter() - start, "detail": detail}


def _load(url: str, prompts: list[str], requests: int, max_tokens: int, on_progress: Any = None) -> dict[str, Any]:
    """`requests` completions from CLIENTS concurrent clients; throughput over the wall time, latency percentiles."""
    done: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        result = _request(url, prompts[i % len(prompts)], max_tokens)
        with lock:
            done.append(result)
            if len(done) % CLIENTS == 0:
                print(f"  {len(done)}/{requests} requests", file=sys.stderr, flush=True)
            if on_progress:
                on_progress(len(done))

    start = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    ok = [d for d in done if d["seen"] == "ok"]
    latencies = sorted(d["latency_s"] for d in ok)
    failures: dict[str, int] = {}
    for d in done:
        if d["seen"] != "ok":
            failures[str(d["seen"])] = failures.get(str(d["seen"]), 0) + 1
    return {
        "requests": requests, "ok": len(ok), "failed": requests - len(ok), "client_saw": failures,
        "failure_details": sorted({d["detail"] for d in done if d["seen"] != "ok"})[:5],
        "wall_s": round(wall, 2), "tokens": sum(d["tokens"] for d in ok),
        "tokens_per_second": round(sum(d["tokens"] for d in ok) / wall, 2),
        "requests_per_second": round(len(ok) / wall, 3),
        "p50_latency_s": round(statistics.median(latencies), 3) if latencies else None,
        "p99_latency_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3) if latencies else None,
    }


def _peak_rss_mib(pod: Pod) -> float | None:
    """The replica process's peak resident memory so far (VmHWM), in MiB."""
    try:
        for line in Path(f"/proc/{pod.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, AttributeError):
        pass
    return None


def add_options(parser: argparse.ArgumentParser) -> None:
    add_bundle_options(parser, TORCH_REF)
    parser.add_argument("--tiny", action="store_true", help="the tiny test pair instead of the demo bundle")
    parser.add_argument("--requests", type=int, default=48, help="requests per phase")
    parser.add_argument("--max-tokens", type=int, default=32)


def _one_replica(args: argparse.Namespace, work: Path, ref: str, keys: Path, manifests: Manifests, prompts: list[str]) -> dict:
    """The baseline: one replica, the clients straight to it (after a warm-up of one request per client)."""
    (solo,) = _pods(work / "solo", ["solo"], ref, keys, manifests)
    with stopping(solo):
        assert solo.start(), solo.init_results[-1].stderr
        solo.wait_ready(600)
        _load(solo.url, prompts, CLIENTS, args.max_tokens)
        return _load(solo.url, prompts, args.requests, args.max_tokens)


def _fleet(args: argparse.Namespace, work: Path, ref: str, keys: Path, manifests: Manifests, prompts: list[str]) -> dict:
    """Three replicas behind haproxy; then the same with one killed (SIGKILL) a third of the way through."""
    result: dict[str, Any] = {}
    pods = _pods(work / "fleet", ["r0", "r1", "r2"], ref, keys, manifests)
    lb = start_haproxy(work, manifests, {p.name: p.port for p in pods})
    with stopping(lb, *pods):
        for pod in pods:
            assert pod.start(), pod.init_results[-1].stderr
        for pod in pods:
            pod.wait_ready(600)
        lb.wait_up({"r0", "r1", "r2"}, timeout=120)
        _load(lb.url, prompts, CLIENTS, args.max_tokens)  # warm-up
        result["fleet_three_replicas"] = _load(lb.url, prompts, args.requests, args.max_tokens)
        print("fleet:", json.dumps(result["fleet_three_replicas"]), file=sys.stderr)
        victim, killed = pods[1], {}

        def kill_at_a_third(n: int) -> None:
            if n == args.requests // 3 and not killed:
                killed["in_flight"] = int(lb.stats()[victim.name]["scur"])  # requests on it as it dies
                killed["at_request"] = n
                victim.proc.send_signal(signal.SIGKILL)

        result["replica_peak_rss_mib"] = {p.name: _peak_rss_mib(p) for p in pods}  # sizes the pods' memory
        died = result["fleet_one_killed"] = _load(lb.url, prompts, args.requests, args.max_tokens, on_progress=kill_at_a_third)
        died["killed"] = {"replica": victim.name, **killed,
                          "lost_beyond_in_flight": max(0, died["failed"] - killed.get("in_flight", 0))}
        print("one killed:", json.dumps(died), file=sys.stderr)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = read_prompt_set(args.prompts)
    manifests = Manifests.load()
    result: dict[str, Any] = {**machine(), "clients": CLIENTS, "requests_per_phase": args.requests, "max_tokens": args.max_tokens,
                              "prompts": args.prompts, "bundle": "tiny test pair" if args.tiny else args.ref}
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, running_registry() as registry:
        work = Path(tmp)
        ref, keys = _publish(args, work, registry.host)
        result["baseline_one_replica"] = _one_replica(args, work, ref, keys, manifests, prompts)
        print("baseline:", json.dumps(result["baseline_one_replica"]), file=sys.stderr)
        result.update(_fleet(args, work, ref, keys, manifests, prompts))
    base, fleet = result["baseline_one_replica"], result["fleet_three_replicas"]
    result["fleet_vs_one_throughput"] = round(fleet["tokens_per_second"] / base["tokens_per_second"], 3)
    result["fleet_vs_one_p99"] = round(fleet["p99_latency_s"] / base["p99_latency_s"], 3)
    return result
