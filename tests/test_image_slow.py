"""The built image (`make image`), run as the manifests run it (opt-in: `pytest -m slow tests/test_image_slow.py`).

Each container of a pod is a fresh working container of the image (`buildah from`), run with `buildah run
--isolation chroot` (podman's own runtime cannot set rlimits in this sandbox) as user 10001, with the manifest's
command and args (the image's entrypoint `bundle` first), its env, and each volume mount a host directory of the
pod's own. chroot isolation shares the host's network, so the server the image runs answers the test from outside
the container. Two pods per bundle, a tiny torch pair and a tiny GGUF pair in a real registry behind htpasswd:
  - deploy/kubernetes: the init container's `bundle pull` into the store volume, then `bundle serve REF`;
  - deploy/kserve: the storage initializer's `bundle fetch URI /mnt/models`, then `bundle serve --from-dir`.
What the test changes, and why: the bundle reference (its registry is the test's), BUNDLE_PLAIN_HTTP=1 (that
registry is plain HTTP on loopback), the listening address and port (loopback, a free port).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import httpx
import pytest
import yaml

from conftest import run_bundle
from registry_server import PASSWORD, USER, Registry, free_port, running_registry
from tests.fleet import ROOT, Manifests, expand
from tests.test_gguf_bench import gguf_context
from tests.tinymodels import make_pair

IMAGE = os.environ.get("SPECBUNDLE_IMAGE", "specbundle:0.1.0")
UID = 10001  # the image's user (deploy/Containerfile), as the manifests' securityContext names it
API_KEY = "image-test-key"
ENTRYPOINT = ["bundle"]


def _image_present() -> bool:
    if shutil.which("buildah") is None:
        return False
    return subprocess.run(["buildah", "inspect", "--type", "image", IMAGE], capture_output=True).returncode == 0


pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _image_present(), reason=f"buildah or the image {IMAGE} is absent: make image")]


@contextlib.contextmanager
def working_container() -> Iterator[str]:
    name = subprocess.run(["buildah", "from", IMAGE], capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], capture_output=True)


def pod_dir(base: Path, name: str) -> Path:
    """A volume: a host directory the container's user owns (as the kubelet's emptyDir with fsGroup)."""
    d = base / name
    d.mkdir(parents=True, exist_ok=True)
    os.chown(d, UID, UID)
    return d


def run_argv(container: Mapping[str, Any], ctr: str, mounts: Mapping[str, tuple[Path, bool]], env: Mapping[str, str],
             port: int) -> list[str]:
    """`buildah run` for one manifest container: command (else the entrypoint) + args with $(VAR) expanded."""
    argv = list(container.get("command") or ENTRYPOINT) + [expand(a, env) for a in container.get("args", [])]
    container_port = str((container.get("ports") or [{}])[0].get("containerPort", ""))
    for i in range(len(argv) - 1):
        if argv[i] == "--host" and argv[i + 1] == "0.0.0.0":
            argv[i + 1] = "127.0.0.1"
        if argv[i] == "--port" and argv[i + 1] == container_port:
            argv[i + 1] = str(port)
    flags = ["--isolation", "chroot", "--network", "host", "--user", f"{UID}:{UID}"]
    for path, (host, read_only) in mounts.items():
        flags += ["-v", f"{host}:{path}" + (":ro" if read_only else "")]
    for key, value in env.items():
        flags += ["--env", f"{key}={value}"]
    return ["buildah", "run", *flags, ctr, "--", *argv]


def container_env(container: Mapping[str, Any], annotations: Mapping[str, str], secrets: Mapping[tuple[str, str], str],
                  overrides: Mapping[str, str]) -> dict[str, str]:
    """The env the kubelet gives the container: values ($(VAR) expanded), the downward API's annotations, Secret keys."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), {**env, **overrides})
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            key = path.removeprefix("metadata.annotations['").removesuffix("']")
            env[item["name"]] = "default" if path == "metadata.namespace" else annotations[key]
        elif (ref := source.get("secretKeyRef")) and (ref["name"], ref["key"]) in secrets:
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
    env.update(overrides)
    return env


def mounted(container: Mapping[str, Any], volumes: Mapping[str, Path], extra: Mapping[str, tuple[Path, bool]] = {}) -> dict[str, tuple[Path, bool]]:
    return {**{m["mountPath"]: (volumes[m["name"]], bool(m.get("readOnly"))) for m in container.get("volumeMounts") or []}, **extra}


@contextlib.contextmanager
def serving(argv: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """The serving container's process (its own session: stopped by its process group, SIGTERM then SIGKILL)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the serving container exited {proc.returncode}: {log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            health = httpx.get(url + "/health", timeout=2)
            if health.status_code == 200:
                return health.json()
        time.sleep(0.5)
    raise AssertionError(f"not ready within {timeout} s: {log.read_text()[-3000:]}")


def chat(url: str, path: str, model: str) -> dict:
    response = httpx.post(f"{url}{path}/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120,
                          json={"model": model, "messages": [{"role": "user", "content": "hello image"}], "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Iterator[dict[str, Any]]:
    """The registry with both bundles pushed (pinned by digest), and the mounted inputs every pod shares."""
    base = tmp_path_factory.mktemp("image")
    os.chmod(base, 0o755)
    with running_registry(auth=True) as registry:
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        inputs = {"trusted-keys": {"bundle.pub": keypair[1].read_bytes()}, "api-key": {"key": f"{API_KEY}\n".encode()},
                  "registry-auth": {"config.json": json.dumps({"auths": {registry.host: {"auth": auth}}}).encode()}}
        dirs = {}
        for name, files in inputs.items():
            dirs[name] = pod_dir(base, name)
            for fname, data in files.items():
                (dirs[name] / fname).write_bytes(data)
                os.chown(dirs[name] / fname, UID, UID)
        refs = {}
        for kind, make in (("torch", make_pair), ("gguf", gguf_context)):
            ctx = base / f"ctx-{kind}"
            make(ctx)
            tag = f"{registry.host}/models/{kind}/tiny-spec:1.0.0"  # the repository named as the signed bundle (serve --expect)
            digest = run_bundle("pack", str(ctx), "-t", tag, "--key", str(keypair[0]), "--store", str(base / f"publisher-{kind}"), check=True).out.split()[-1]
            run_bundle("push", tag, "--plain-http", "--store", str(base / f"publisher-{kind}"), env={"DOCKER_CONFIG": str(dirs["registry-auth"])}, check=True)
            refs[kind] = f"{registry.host}/models/{kind}/tiny-spec@{digest}"
        yield {"base": base, "registry": registry, "dirs": dirs, "refs": refs}


@pytest.mark.parametrize("kind", ["torch", "gguf"])
def test_the_image_pulls_verifies_and_serves_as_the_deployment_says(world: dict[str, Any], kind: str) -> None:
    start = time.monotonic()
    m = Manifests.load()
    annotations = {**m.annotations(), "specbundle.bundle-ref": world["refs"][kind]}
    pod = world["base"] / f"deployment-{kind}"
    volumes = {**world["dirs"], "store": pod_dir(pod, "store"), "tmp": pod_dir(pod, "tmp")}
    init, main = m.pod["spec"]["initContainers"][0], m.main()
    env = container_env(init, annotations, {}, {"BUNDLE_PLAIN_HTTP": "1"})
    with working_container() as ctr:
        pulled = subprocess.run(run_argv(init, ctr, mounted(init, volumes), env, 0), capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    port = free_port()
    env = container_env(main, annotations, {}, {"BUNDLE_PLAIN_HTTP": "1", "POD_NAMESPACE": "default"})
    with working_container() as ctr, serving(run_argv(main, ctr, mounted(main, volumes), env, port), pod / "serve.log") as proc:
        url = f"http://127.0.0.1:{port}"
        health = wait_ready(url, proc, pod / "serve.log")
        answer = chat(url, "/v1", world["refs"][kind])
    assert answer["choices"][0]["message"]["content"] is not None and answer["usage"]["completion_tokens"] > 0
    assert health["bundle"]["digest"] == world["refs"][kind].split("@")[1]
    print(f"\n{kind} deployment pod (pull, serve, one chat request): {time.monotonic() - start:.1f} s")


@pytest.mark.parametrize("kind", ["torch", "gguf"])
def test_the_image_fetches_verifies_and_serves_as_kserve_runs_it(world: dict[str, Any], kind: str) -> None:
    start = time.monotonic()
    docs = {d["kind"]: d for f in ("clusterstoragecontainer.yaml", "inferenceservice.yaml")
            for d in yaml.safe_load_all((ROOT / "deploy" / "kserve" / f).read_text()) if d}
    isvc, csc = docs["InferenceService"], docs["ClusterStorageContainer"]["spec"]["container"]
    main = isvc["spec"]["predictor"]["containers"][0]
    uri = f"bundle://{world['refs'][kind]}"
    pod = world["base"] / f"kserve-{kind}"
    volumes = {"specbundle-trusted-keys": world["dirs"]["trusted-keys"], "specbundle-api-key": world["dirs"]["api-key"],
               "tmp": pod_dir(pod, "tmp")}
    models = pod_dir(pod, "models")
    secrets = {("specbundle-registry", "username"): USER, ("specbundle-registry", "password"): PASSWORD}
    # KServe's storage initializer: the ClusterStorageContainer's command, then the args [storageUri, /mnt/models].
    init = {**csc, "args": [uri, "/mnt/models"]}
    env = container_env(init, {}, secrets, {"BUNDLE_PLAIN_HTTP": "1"})
    with working_container() as ctr:
        fetched = subprocess.run(run_argv(init, ctr, mounted(init, volumes, {"/mnt/models": (models, False)}), env, 0),
                                 capture_output=True, text=True, timeout=300)
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    port = free_port()
    env = container_env(main, {}, {}, {"STORAGE_URI": uri})
    with working_container() as ctr, serving(run_argv(main, ctr, mounted(main, volumes, {"/mnt/models": (models, True)}), env, port),
                                             pod / "serve.log") as proc:
        url = f"http://127.0.0.1:{port}"
        health = wait_ready(url, proc, pod / "serve.log")
        answer = chat(url, "/openai/v1", isvc["metadata"]["name"])
    assert answer["usage"]["completion_tokens"] > 0
    assert health["bundle"]["digest"] == world["refs"][kind].split("@")[1]
    print(f"\n{kind} KServe pod (fetch, serve --from-dir, one chat request): {time.monotonic() - start:.1f} s")
