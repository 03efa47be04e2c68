"""A fleet on one machine, run as deploy/kubernetes says (tests/fleet.py reads the pods' commands from the YAML):
a real docker-registry holding the signed tiny bundle, replicas each with its own port and store, Debian's
haproxy in front health-checking the readiness path, Debian's prometheus scraping what the annotations say.

What the test adds to the manifests' environment, and why: the bundle reference (the registry is the test's),
BUNDLE_PLAIN_HTTP=1 (that registry is plain HTTP on loopback). Everything else is the manifests'.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import run_bundle
from registry_server import PASSWORD, USER, Registry, running_registry
from tests.fleet import Manifests, Pod, pod_volumes, start_haproxy, start_prometheus, stopping, wait_for
from tests.tinymodels import make_pair, write_kitfile

REPO = "models/tiny-spec"
API_KEY = "fleet-api-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


class World:
    """The registries, the two signed releases, and the mounted inputs (trusted keys, registry auth, API key)."""

    def __init__(self, base: Path, registry: Registry, mirror: Registry, keypair: tuple[Path, Path], other: tuple[Path, Path]):
        self.base, self.registry, self.mirror = base, registry, mirror
        self.refs = {v: f"{registry.host}/{REPO}:{v}" for v in ("1.0.0", "1.1.0")}
        self.trusted = self._dir("trusted-keys", {"bundle.pub": keypair[1].read_bytes()})
        self.untrusted = self._dir("untrusted-keys", {"bundle.pub": other[1].read_bytes()})
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        self.registry_auth = self._dir("registry-auth", {"config.json": json.dumps({"auths": {registry.host: {"auth": auth}}}).encode()})
        self.api_key = self._dir("api-key", {"key": f"{API_KEY}\n".encode()})
        self.digests: dict[str, str] = {}
        publisher = base / "publisher"
        for version in ("1.0.0", "1.1.0"):
            ctx = base / f"ctx-{version}"
            make_pair(ctx)
            write_kitfile(ctx, version=version)
            out = run_bundle("pack", str(ctx), "-t", self.refs[version], "--key", str(keypair[0]), "--store", str(publisher), check=True)
            self.digests[version] = out.out.split()[-1]
            run_bundle("push", self.refs[version], "--plain-http", "--store", str(publisher),
                       env={"DOCKER_CONFIG": str(self.registry_auth)}, check=True)
        # The mirror's copy of 1.0.0 is damaged: one byte of its largest layer, the size unchanged.
        self.damaged_ref = f"{mirror.host}/{REPO}:1.0.0"
        run_bundle("push", self.refs["1.0.0"], self.damaged_ref, "--plain-http", "--store", str(publisher),
                   env={"DOCKER_CONFIG": str(self.registry_auth)}, check=True)
        manifest = httpx.get(f"http://{mirror.host}/v2/{REPO}/manifests/1.0.0", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).json()
        blob = mirror.blob_file(max(manifest["layers"], key=lambda d: d["size"])["digest"])
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))

    def _dir(self, name: str, files: dict[str, bytes]) -> Path:
        d = self.base / name
        d.mkdir()
        for fname, data in files.items():
            (d / fname).write_bytes(data)
        return d

    def pod(self, name: str, port: int, ref: str, manifests: Manifests, trusted: Path | None = None, group: str = "pods") -> Pod:
        """A pod of the Deployment with its own store; the same group and name again is the same pod's volumes."""
        workdir = self.base / group / name
        workdir.mkdir(parents=True, exist_ok=True)
        volumes = pod_volumes(workdir, trusted or self.trusted, self.registry_auth, self.api_key)
        return Pod(name, port, workdir, manifests, volumes, {"BUNDLE_REF": ref, "BUNDLE_PLAIN_HTTP": "1"})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, keypair, other_keypair) -> Iterator[World]:
    base = tmp_path_factory.mktemp("fleet")
    with running_registry(auth=True) as registry, running_registry() as mirror:
        yield World(base, registry, mirror, keypair, other_keypair)


def _complete(url: str, prompt: str = "hello fleet") -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": 0}, headers=AUTH, timeout=120)


def _replica_sums(pods: list[Pod]) -> dict[str, float]:
    """The counters summed over the replicas' own /metrics, to compare with what Prometheus says."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for pod in pods:
        for family in text_string_to_metric_families(httpx.get(pod.url + "/metrics").text):
            for s in family.samples:
                if s.name in ("specbundle_draft_tokens_total", "specbundle_accepted_tokens_total",
                              "specbundle_spec_decode_num_draft_tokens_total", "specbundle_spec_decode_num_accepted_tokens_total") or (
                        s.name == "specbundle_requests_total" and s.labels.get("status") == "ok"):
                    sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


def test_the_fleet_serves_only_verified_replicas_and_prometheus_sees_each_digest(world: World) -> None:
    from tests.fleet import free_port

    manifests = Manifests.load()
    names = ["r0", "r1", "r2", "damaged", "untrusted"]
    slots = {name: free_port() for name in names}
    pods = [world.pod(n, slots[n], world.refs["1.0.0"], manifests) for n in names[:3]]
    damaged = world.pod("damaged", slots["damaged"], world.damaged_ref, manifests)
    untrusted = world.pod("untrusted", slots["untrusted"], world.refs["1.0.0"], manifests, trusted=world.untrusted)
    lb = start_haproxy(world.base, manifests, slots)
    prom = start_prometheus(world.base, manifests, slots, both=True)  # the annotations' job and the ServiceMonitor's
    with stopping(lb, prom, *pods, damaged, untrusted):
        for pod in pods + [damaged, untrusted]:
            pod.start()
        # A bad registry copy or an untrusted key: the init container refuses, the server never starts.
        for pod, code in ((damaged, "digest-mismatch"), (untrusted, "untrusted-signer")):
            result = pod.init_results[-1]
            assert pod.proc is None and result.returncode == 3, result.stderr
            assert result.stderr.strip().splitlines()[-1].startswith(f"error: [{code}]"), result.stderr
        for pod in pods:
            pod.wait_ready()
            # Readiness: 503 from the port's opening until the pair is loaded, then 200; liveness: 200 while it moves.
            assert set(pod.readiness_seen) <= {503, 200} and pod.readiness_seen[-1] == 200, pod.readiness_seen
            assert pod.probe(manifests.liveness()) == 200
        lb.wait_up({"r0", "r1", "r2"})

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: _complete(lb.url, f"request {i}"), range(12)))
        assert [r.status_code for r in answers] == [200] * 12
        assert {r.headers["x-bundle-digest"] for r in answers} == {world.digests["1.0.0"]}
        stats = lb.stats()
        assert {n: stats[n]["status"] for n in ("damaged", "untrusted")} == {"damaged": "DOWN", "untrusted": "DOWN"}
        assert stats["damaged"]["stot"] == stats["untrusted"]["stot"] == "0"  # never routed to

        # Prometheus, over its HTTP API, each replica scraped by both shipped jobs: the queries of docs/deploy.md
        # take one series per replica (max by instance) before adding replicas, so nothing is counted twice.
        wait_for(lambda: prom.scalar('sum(specbundle_requests_total{status="ok"})') == 24, 30, "both jobs to count 12 requests")
        assert prom.scalar('sum(max by (instance) (specbundle_requests_total{status="ok"}))') == 12
        info = prom.query("max by (pod, digest) (specbundle_bundle_info)")
        assert sorted(r["metric"]["pod"] for r in info) == ["r0", "r1", "r2"]
        assert {r["metric"]["digest"] for r in info} == {world.digests["1.0.0"]}
        assert prom.targets_up() == {"r0": 1.0, "r1": 1.0, "r2": 1.0, "damaged": 0.0, "untrusted": 0.0}
        sums = _replica_sums(pods)
        assert sums["specbundle_draft_tokens_total"] > 0
        assert sums["specbundle_spec_decode_num_draft_tokens_total"] == sums["specbundle_draft_tokens_total"]
        rate = prom.scalar("sum(max by (instance) (specbundle_spec_decode_num_accepted_tokens_total))"
                           " / sum(max by (instance) (specbundle_spec_decode_num_draft_tokens_total))")
        assert rate == pytest.approx(sums["specbundle_accepted_tokens_total"] / sums["specbundle_draft_tokens_total"])
        # The acceptance per served digest (counters joined to bundle_info's digest, one series per replica each).
        per_digest = prom.query(
            "sum by (digest) (max by (instance) (specbundle_spec_decode_num_accepted_tokens_total)"
            " * on(instance) group_left(digest) max by (instance, digest) (specbundle_bundle_info))"
            " / sum by (digest) (max by (instance) (specbundle_spec_decode_num_draft_tokens_total)"
            " * on(instance) group_left(digest) max by (instance, digest) (specbundle_bundle_info))")
        assert [(r["metric"]["digest"], pytest.approx(float(r["value"][1]))) for r in per_digest] == [(world.digests["1.0.0"], rate)]


def test_a_rollback_is_refused_unless_the_manifest_allows_it(world: World) -> None:
    from tests.fleet import free_port

    newer = world.pod("rollback", free_port(), world.refs["1.1.0"], Manifests.load())
    assert newer.init(), newer.init_results[-1].stderr
    # The same pod's store, now asked for the older signed release by the base manifests: refused.
    older = world.pod("rollback", newer.port, world.refs["1.0.0"], Manifests.load())
    assert not older.init()
    result = older.init_results[-1]
    assert result.returncode == 3 and result.stderr.strip().splitlines()[-1].startswith("error: [rollback]"), result.stderr
    # With the overlay that says so (deploy/kubernetes/overlays/allow-rollback), the init container accepts it.
    allowed = world.pod("rollback", newer.port, world.refs["1.0.0"], Manifests.load("allow-rollback"))
    assert "--allow-rollback" in allowed.processes()[0].argv
    assert allowed.init(), allowed.init_results[-1].stderr
    assert allowed.init_results[-1].stdout.split()[-1] == world.digests["1.0.0"]


@pytest.mark.slow
def test_a_rolling_update_fails_no_request_and_prometheus_sees_both_digests(world: World) -> None:
    """1.0.0 -> 1.1.0 one pod at a time as the Deployment's strategy says (maxSurge 1, maxUnavailable 0): a new
    pod starts and becomes ready, then an old one is stopped (SIGTERM), while clients keep sending requests."""
    from tests.fleet import free_port

    manifests = Manifests.load()
    strategy = manifests.deployment["spec"]["strategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (1, 0)
    old_names, new_names = ["r0", "r1", "r2"], ["n0", "n1", "n2"]
    slots = {name: free_port() for name in old_names + new_names}
    old = [world.pod(n, slots[n], world.refs["1.0.0"], manifests, group="roll") for n in old_names]
    new = [world.pod(n, slots[n], world.refs["1.1.0"], manifests, group="roll") for n in new_names]
    lb = start_haproxy(world.base / "roll", manifests, slots)
    prom = start_prometheus(world.base / "roll", manifests, slots)
    outcomes: list[Any] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set() and len(outcomes) < 5000:
            try:
                r = _complete(lb.url)
                outcomes.append((r.status_code, r.headers.get("x-bundle-digest")))
            except httpx.HTTPError as exc:
                outcomes.append((type(exc).__name__, None))

    with stopping(lb, prom, *old, *new):
        for pod in old:
            assert pod.start(), pod.init_results[-1].stderr
        for pod in old:
            pod.wait_ready()
        lb.wait_up(set(old_names))
        clients = [threading.Thread(target=client) for _ in range(4)]
        for t in clients:
            t.start()
        try:
            seen_both = False
            for i, (pod, retired) in enumerate(zip(new, old)):
                assert pod.start(), pod.init_results[-1].stderr
                pod.wait_ready()
                lb.wait_up({*new_names[: i + 1], *old_names[i:]})
                if i == 0:  # mid-roll: both releases serve, and Prometheus sees both digests
                    digests = wait_for(lambda: {r["metric"]["digest"] for r in prom.query("specbundle_bundle_info")} == set(world.digests.values()),
                                       30, "Prometheus to see both digests")
                    seen_both = bool(digests)
                retired.stop()
                lb.wait_up({*new_names[: i + 1], *old_names[i + 1:]}, timeout=60)
        finally:
            stop.set()
            for t in clients:
                t.join(180)
    assert seen_both
    failed = [o for o in outcomes if o[0] != 200]
    assert outcomes and not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:5]}"
    served = {d for _, d in outcomes}
    assert served == set(world.digests.values())
    assert outcomes[-1][1] == world.digests["1.1.0"]
