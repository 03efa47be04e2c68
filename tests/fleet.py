"""A fleet on one machine, run exactly as deploy/kubernetes says: the pods' commands read from the manifests,
Debian's haproxy in front (health-checking the readiness probe's path), Debian's prometheus scraping what the
pod annotations say. Used by tests/test_fleet.py and benchmarks/fleet.py.

What stands in for Kubernetes, and only that: a pod is its init containers run in order, then its main
container, each as a process (the image's entrypoint `bundle` is `python -m bundler` from this tree), with the
container's env (`value` entries and the kustomize-generated ConfigMap behind `envFrom`), `$(VAR)` expanded in
args as the kubelet expands it, every volume mount a directory of the pod's own, and the pod's network a
loopback port of its own (`--host 0.0.0.0` becomes 127.0.0.1, `--port <containerPort>` the pod's port).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "deploy" / "kubernetes" / "base"
OVERLAYS = ROOT / "deploy" / "kubernetes" / "overlays"
ENTRYPOINT = [sys.executable, "-m", "bundler"]  # the image's ENTRYPOINT ["bundle"] (deploy/Containerfile)
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


_TAKEN: set[int] = set()  # ports this process handed out: never handed out twice


def free_port() -> int:
    """A loopback port nobody listens on now, and not one given out before by this process (bounded tries)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _TAKEN:
            _TAKEN.add(port)
            return port
    raise RuntimeError("no free loopback port")


# -- the manifests -----------------------------------------------------------------------------------
def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def base_objects() -> list[dict[str, Any]]:
    """Every object the base lists in `resources`, as written."""
    return [doc for name in kustomization(BASE)["resources"] for doc in _documents(BASE / name)]


def _generated(k: Mapping[str, Any], name: str) -> dict[str, str]:
    for gen in k.get("configMapGenerator") or []:
        if gen["name"] == name:
            return dict(item.split("=", 1) for item in gen.get("literals") or [])
    return {}


@dataclass
class Manifests:
    """The Deployment and its generated ConfigMaps, from the base with the overlays named applied in order."""

    deployment: dict[str, Any]
    config_maps: dict[str, dict[str, str]]

    @classmethod
    def load(cls, *overlays: str) -> "Manifests":
        import jsonpatch  # RFC 6902, as kustomize applies `patches:` written as JSON patches

        deployment = next(o for o in base_objects() if o["kind"] == "Deployment")
        base = kustomization(BASE)
        maps = {g["name"]: _generated(base, g["name"]) for g in base.get("configMapGenerator") or []}
        for name in overlays:
            k = kustomization(OVERLAYS / name)
            for gen in k.get("configMapGenerator") or []:
                maps.setdefault(gen["name"], {}).update(_generated(k, gen["name"]))
            for patch in k.get("patches") or []:
                if patch["target"]["kind"] == "Deployment":
                    deployment = jsonpatch.apply_patch(deployment, yaml.safe_load(patch["patch"]))
        return cls(copy.deepcopy(deployment), maps)

    @property
    def pod(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]

    def annotations(self) -> dict[str, str]:
        return dict(self.pod["metadata"].get("annotations") or {})

    def main(self) -> dict[str, Any]:
        return self.pod["spec"]["containers"][0]

    def readiness(self) -> dict[str, Any]:
        return self.main()["readinessProbe"]

    def liveness(self) -> dict[str, Any]:
        return self.main()["livenessProbe"]

    def service_monitor(self) -> dict[str, Any] | None:
        """The base's ServiceMonitor (the Prometheus operator's scrape of the same pods), if it ships one."""
        return next((o for o in base_objects() if o["kind"] == "ServiceMonitor"), None)


NAMESPACE = "default"  # the namespace the harness's pods run in (the downward API's metadata.namespace)


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args: defined names replaced, `$$` is `$`, others left."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


@dataclass
class Container:
    name: str
    argv: list[str]
    env: dict[str, str]


def container_process(container: Mapping[str, Any], manifests: Manifests, mounts: Mapping[str, Path], port: int,
                      env_overrides: Mapping[str, str]) -> Container:
    """One container as the process the kubelet would start on this pod: argv and environment."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(manifests.config_maps[source["configMapRef"]["name"]])
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        else:  # the downward API: only the fields the manifests use
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = {"metadata.namespace": NAMESPACE,
                                 **{f"metadata.annotations['{k}']": v for k, v in manifests.annotations().items()}}[field]
    env.update(env_overrides)
    paths = {m["mountPath"]: mounts[m["name"]] for m in container.get("volumeMounts") or []}

    def local(value: str) -> str:
        for mount_path, directory in sorted(paths.items(), key=lambda kv: -len(kv[0])):
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(directory) + value[len(mount_path):]
        return value

    env = {k: local(v) for k, v in env.items()}
    args = [local(expand(a, env)) for a in container.get("command", []) + container.get("args", [])]
    container_port = str((container.get("ports") or [{}])[0].get("containerPort", ""))
    for i in range(len(args) - 1):  # the pod's network: its own loopback port
        if args[i] == "--host" and args[i + 1] == "0.0.0.0":
            args[i + 1] = "127.0.0.1"
        if args[i] == "--port" and args[i + 1] == container_port:
            args[i + 1] = str(port)
    return Container(container["name"], ENTRYPOINT + args, env)


# -- a pod -------------------------------------------------------------------------------------------
@dataclass
class Pod:
    """One replica: its init containers' outcome, then its main container's process."""

    name: str
    port: int
    workdir: Path
    manifests: Manifests
    volumes: dict[str, Path]
    env_overrides: dict[str, str] = field(default_factory=dict)
    init_results: list[subprocess.CompletedProcess] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log: Path | None = None
    readiness_seen: list[int] = field(default_factory=list)  # each answer the readiness probe got, in order

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def processes(self) -> list[Container]:
        spec = self.manifests.pod["spec"]
        return [container_process(c, self.manifests, self.volumes, self.port, self.env_overrides)
                for c in spec.get("initContainers", []) + spec["containers"]]

    @staticmethod
    def _env(extra: Mapping[str, str]) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if k not in ("BUNDLE_TRUSTED_KEYS", "BUNDLE_HOME", "DOCKER_CONFIG", "BUNDLE_PLAIN_HTTP")}
        return {**inherited, **extra, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}

    def init(self, timeout: float = 120) -> bool:
        """Run the init containers in order, each to its end; False at the first that fails (Init:Error)."""
        self.init_results = []
        for c in self.processes()[:-1]:
            result = subprocess.run(c.argv, env=self._env(c.env), capture_output=True, text=True, timeout=timeout, cwd=self.workdir)
            self.init_results.append(result)
            if result.returncode != 0:
                return False
        return True

    def start(self, init_timeout: float = 120) -> bool:
        """The pod's start: its init containers, then its main container only if every one exited 0."""
        if not self.init(init_timeout):
            return False  # Init:Error: the main container never starts
        main = self.processes()[-1]
        self.log = self.workdir / f"{self.name}.log"
        self.proc = subprocess.Popen(main.argv, env=self._env(main.env), cwd=self.workdir,
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        return True

    def probe(self, probe: Mapping[str, Any]) -> int | None:
        """The status a probe's GET gets (None: no answer, the port not open)."""
        try:
            return requests.get(self.url + probe["httpGet"]["path"], timeout=probe.get("timeoutSeconds", 2)).status_code
        except requests.RequestException:
            return None

    def ready(self) -> bool:
        """What the readiness probe sees: GET <path> answers 200."""
        status = self.probe(self.manifests.readiness())
        if status is not None:
            self.readiness_seen.append(status)
        return status == 200

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log.read_text()[-2000:] if self.log else self.init_results}")
            if self.ready():
                return
            time.sleep(0.3)
        raise AssertionError(f"{self.name} not ready within {timeout} s")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def pod_volumes(workdir: Path, trusted_keys: Path, registry_auth: Path, api_key: Path) -> dict[str, Path]:
    """The pod's volumes by name: its own emptyDirs (store, tmp) and the mounted ConfigMap and Secrets."""
    volumes = {"store": workdir / "store", "tmp": workdir / "tmp", "trusted-keys": trusted_keys,
               "registry-auth": registry_auth, "api-key": api_key}
    for name in ("store", "tmp"):
        volumes[name].mkdir(parents=True, exist_ok=True)
    return volumes


# -- haproxy -----------------------------------------------------------------------------------------
@dataclass
class HAProxy:
    """Debian's haproxy on loopback in front of fixed server slots (a slot without a pod is DOWN)."""

    port: int
    stats_port: int
    proc: subprocess.Popen
    config: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, dict[str, str]]:
        """haproxy's own CSV stats, by server name (backend `pods`)."""
        text = requests.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5).text.lstrip("# ")
        return {row["svname"]: row for row in csv.DictReader(io.StringIO(text)) if row["pxname"] == "pods" and row["svname"] != "BACKEND"}

    def up(self) -> set[str]:
        return {name for name, row in self.stats().items() if row["status"].startswith("UP")}

    def wait_up(self, expected: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.up() == expected:
                return
            time.sleep(0.2)
        raise AssertionError(f"haproxy sees {self.up()} up, expected {expected}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def haproxy_config(manifests: Manifests, slots: Mapping[str, int], port: int, stats_port: int) -> str:
    """A backend health-checking the readiness probe's path at its period and failure threshold."""
    probe = manifests.readiness()  # Kubernetes' defaults where the probe leaves a field out
    check = (f"default-server inter {probe.get('periodSeconds', 10)}s fall {probe.get('failureThreshold', 3)} "
             f"rise {probe.get('successThreshold', 1)}")
    lines = [
        "global", "  maxconn 512",
        "defaults", "  mode http", "  timeout connect 2s", "  timeout client 300s", "  timeout server 300s",
        # A connection refused (a pod going away) is retried on another server, and so is a request whose pod
        # closed the connection without answering anything (haproxy buffers it for that); one whose response had
        # begun when the pod died cannot be: the client sees a 502 for it.
        "  retries 3", "  option redispatch 1", "  retry-on conn-failure empty-response",
        f"  timeout check {probe.get('timeoutSeconds', 1)}s",
        "frontend fleet", f"  bind 127.0.0.1:{port}", "  default_backend pods",
        "frontend stats", f"  bind 127.0.0.1:{stats_port}", "  stats enable", "  stats uri /stats",
        "backend pods", "  balance leastconn",
        f"  option httpchk GET {probe['httpGet']['path']}", "  http-check expect status 200", f"  {check}",
    ]
    lines += [f"  server {name} 127.0.0.1:{p} check" for name, p in slots.items()]
    return "\n".join(lines) + "\n"


def start_haproxy(workdir: Path, manifests: Manifests, slots: Mapping[str, int]) -> HAProxy:
    if shutil.which("haproxy") is None:
        raise RuntimeError("haproxy is not installed (make sysdeps)")
    port, stats_port = free_port(), free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(haproxy_config(manifests, slots, port, stats_port))
    check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"haproxy refuses its config: {check.stdout}{check.stderr}")
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=open(workdir / "haproxy.log", "wb"))
    lb = HAProxy(port, stats_port, proc, config)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {(workdir / 'haproxy.log').read_text()[-2000:]}")
        with contextlib.suppress(requests.RequestException):
            lb.stats()
            return lb
        time.sleep(0.1)
    lb.stop()
    raise RuntimeError("haproxy did not start")


# -- prometheus --------------------------------------------------------------------------------------
@dataclass
class Prometheus:
    port: int
    proc: subprocess.Popen

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = requests.get(f"http://127.0.0.1:{self.port}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> dict[str, float]:
        return {r["metric"]["pod"]: float(r["value"][1]) for r in self.query('up{job="specbundle"}')}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def scrape_config(manifests: Manifests, slots: Mapping[str, int], interval: str = "1s", both: bool = False) -> dict[str, Any]:
    """What a kubernetes_sd job keeping pods annotated prometheus.io/scrape=true would scrape: each pod's
    prometheus.io/port (here: the pod's own loopback port) at prometheus.io/path, labelled with the pod. both:
    also the shipped ServiceMonitor's job over the same pods (the operator labels its targets with the service
    and endpoint too), as a cluster running both ways of scraping does: every replica is scraped twice."""
    notes = manifests.annotations()
    jobs = []
    if notes.get("prometheus.io/scrape") == "true":
        container_port = str(manifests.main()["ports"][0]["containerPort"])
        assert notes.get("prometheus.io/port", container_port) == container_port, "the annotation names the serving port"
        jobs.append({"job_name": "specbundle", "scrape_interval": interval, "scrape_timeout": interval,
                     "metrics_path": notes.get("prometheus.io/path", "/metrics"),
                     "static_configs": [{"targets": [f"127.0.0.1:{p}"], "labels": {"pod": name}} for name, p in slots.items()]})
    monitor = manifests.service_monitor()
    if both and monitor is not None:
        endpoint = monitor["spec"]["endpoints"][0]
        assert endpoint["port"] == manifests.main()["ports"][0]["name"], "the ServiceMonitor scrapes the serving port"
        labels = {"service": monitor["metadata"]["name"], "endpoint": endpoint["port"]}
        jobs.append({"job_name": f"serviceMonitor/{NAMESPACE}/{monitor['metadata']['name']}/0", "scrape_interval": interval,
                     "scrape_timeout": interval, "metrics_path": endpoint.get("path", "/metrics"),
                     "static_configs": [{"targets": [f"127.0.0.1:{p}"], "labels": {"pod": name, **labels}}
                                        for name, p in slots.items()]})
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}


def start_prometheus(workdir: Path, manifests: Manifests, slots: Mapping[str, int], both: bool = False) -> Prometheus:
    """Prometheus scraping the pods as the manifests say (both: by the annotations and the ServiceMonitor)."""
    if shutil.which("prometheus") is None:
        raise RuntimeError("prometheus is not installed (make sysdeps)")
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(manifests, slots, both=both)))
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        stdout=subprocess.DEVNULL, stderr=open(workdir / "prometheus.log", "wb"),
    )
    prom = Prometheus(port, proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200:
                return prom
        time.sleep(0.2)
    prom.stop()
    raise RuntimeError("prometheus did not become ready")


def wait_for(fn: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    """Poll fn() until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def stopping(*things: Any) -> Iterator[None]:
    """Stop each thing (by its own pid) on the way out, whatever happened."""
    try:
        yield
    finally:
        for thing in reversed(things):
            with contextlib.suppress(Exception):
                thing.stop()
