"""k8s/ manifests: every overlay (and k8s/serve, k8s/data) renders; RayCluster, RayJob and RayService validate
against KubeRay's CRD schemas (unknown fields rejected); core objects against Kubernetes' schemas; KubeRay's own
rules; the security defaults; the RayJob's entrypoint is a valid `growpipe train` command line; the RayService's
serveConfigV2 is what `growpipe serve --print-config` prints; the MLflow server (its manifest's own arguments,
run here) accepts the Host every pod sends; the data Job fills the volume the Ray pods read; k8s/README.md's
command blocks are marked as needing a cluster."""

from __future__ import annotations

import copy
import functools
import http.client
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from growpipe.cli import build_parser, main
from growpipe.config import load_config
from growpipe.serve.deploy import ServeOptions, serve_config
from growpipe.serve.source import Source
from tests.k8s_render import render, render_in_python, render_with_kubectl

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
CRDS = REPO.parent / "shared" / "kuberay-crds"
OVERLAYS = ["gpu", "cpu", "postgres-s3"]
SERVE = K8S / "serve"  # the RayService, applied on its own (k8s/README.md)
DATA = K8S / "data"  # the Job that fills the data volume, applied on its own (k8s/README.md)
NO_CLUSTER = "<!-- doc: not run here: needs a Kubernetes cluster -->"  # above each README block no test runs
KUBERAY_OPERATOR = {"namespace": "kuberay-system", "pod": {"app.kubernetes.io/name": "kuberay-operator"}}
SECRET_NAMES = ("PASSWORD", "SECRET", "TOKEN", "ACCESS_KEY", "CREDENTIAL")


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 CRD schema as JSON Schema that rejects unknown fields (as the API server prunes them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache  # the CRD schemas are large: load and convert each once
def _crd_validator(kind: str) -> jsonschema.Validator:
    crd = yaml.load((CRDS / f"ray.io_{kind.lower()}s.yaml").read_text(), Loader=yaml.CSafeLoader)  # libyaml: ~10x
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def _errors(obj: dict[str, Any]) -> list[str]:
    v = _crd_validator(obj["kind"])
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:160]}" for e in v.iter_errors(obj)]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {o: render(K8S / "overlays" / o) for o in OVERLAYS}


@pytest.fixture(scope="module")
def serving() -> list[dict[str, Any]]:
    return render(SERVE)


@pytest.fixture(scope="module")
def filling() -> list[dict[str, Any]]:
    return render(DATA)


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def _cluster_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The Ray cluster a RayCluster or a RayService describes."""
    return obj["spec"]["rayClusterConfig"] if obj["kind"] == "RayService" else obj["spec"]


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] in ("Deployment", "Job"):
        return [spec["template"]["spec"]]
    if obj["kind"] in ("RayCluster", "RayService"):
        cluster = _cluster_spec(obj)
        return [cluster["headGroupSpec"]["template"]["spec"]] + [w["template"]["spec"] for w in
                                                                  cluster["workerGroupSpecs"]]  # fmt: skip
    if obj["kind"] == "RayJob":
        return [spec["submitterPodTemplate"]["spec"]]
    return []


def _head_port(obj: dict[str, Any], name: str) -> int:
    ports = _cluster_spec(obj)["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    return next(p["containerPort"] for p in ports if p["name"] == name)


def test_every_overlay_renders_the_whole_service(rendered, serving, filling):
    for name, objs in rendered.items():
        kinds = sorted(o["kind"] for o in objs)
        assert {"RayCluster", "RayJob", "Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy"} <= set(kinds)
        assert all(o["metadata"].get("namespace") == "growpipe" for o in objs if o["kind"] != "Namespace"), name
    gpu = _one(rendered["gpu"], "RayCluster")["spec"]["workerGroupSpecs"][0]
    cpu = _one(rendered["cpu"], "RayCluster")["spec"]["workerGroupSpecs"][0]
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in str(cpu) and cpu["groupName"] == "cpu"
    assert [(o["kind"], o["metadata"]["namespace"]) for o in serving] == [("RayService", "growpipe")]
    assert [(o["kind"], o["metadata"]["namespace"]) for o in filling] == [("Job", "growpipe")]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: only the Python builder runs")
def test_python_builder_agrees_with_kubectl_kustomize():
    for path in [K8S / "overlays" / o for o in OVERLAYS] + [SERVE, DATA]:
        key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
        assert sorted(render_in_python(path), key=key) == sorted(render_with_kubectl(path), key=key), path


def test_ray_objects_match_the_kuberay_crds(rendered, serving):
    for objs in rendered.values():
        for kind in ("RayCluster", "RayJob"):
            obj = _one(objs, kind)
            assert obj["apiVersion"] == "ray.io/v1"
            assert _errors(obj) == [], kind
    service = _one(serving, "RayService")
    assert service["apiVersion"] == "ray.io/v1" and _errors(service) == []


def test_crd_check_catches_a_misspelled_field_and_a_wrong_type(rendered, serving):
    cluster = copy.deepcopy(_one(rendered["gpu"], "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["maxReplica"] = 8  # misspelled
    cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = "zero"  # wrong type
    errors = _errors(cluster)
    assert any("maxReplica" in e and "not allowed" in e for e in errors), errors
    assert any("minReplicas" in e and "is not of type 'integer'" in e for e in errors), errors
    job = copy.deepcopy(_one(rendered["gpu"], "RayJob"))
    job["spec"]["backofLimit"] = 3
    assert any("backofLimit" in e for e in _errors(job))
    service = copy.deepcopy(_one(serving, "RayService"))
    service["spec"]["serveConfigv2"] = service["spec"].pop("serveConfigV2")  # misspelled
    service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "2"  # wrong type
    errors = _errors(service)
    assert any("serveConfigv2" in e and "not allowed" in e for e in errors), errors
    assert any("maxReplicas" in e and "is not of type 'integer'" in e for e in errors), errors


def test_core_objects_match_the_kubernetes_schemas(rendered, filling):
    version = kubernetes_validate.utils.latest_version()
    for objs in [*rendered.values(), filling]:
        for obj in objs:
            if not obj["apiVersion"].startswith("ray.io"):
                kubernetes_validate.validate(obj, version, strict=True)
    bad = copy.deepcopy(_one(rendered["gpu"], "Service"))
    bad["spec"]["typ"] = "ClusterIP"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def test_kuberay_rules_hold(rendered, serving):
    pinned = next(line for line in (REPO / "pyproject.toml").read_text().splitlines() if '"ray[' in line)
    service = _one(serving, "RayService")
    for objs in rendered.values():
        for obj in (_one(objs, "RayCluster"), service):
            spec = _cluster_spec(obj)
            assert pinned.split("<")[-1].startswith(spec["rayVersion"].rsplit(".", 1)[0][:3])  # the code's Ray line
            assert spec["enableInTreeAutoscaling"] is True
            assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no stage or replica on the head
            names = [w["groupName"] for w in spec["workerGroupSpecs"]]
            assert len(names) == len(set(names))
            for w in spec["workerGroupSpecs"]:
                assert 0 <= w["minReplicas"] <= w.get("replicas", w["minReplicas"]) <= w["maxReplicas"]
        job = _one(objs, "RayJob")["spec"]
        assert job["clusterSelector"]["ray.io/cluster"] == _one(objs, "RayCluster")["metadata"]["name"]
        assert job.get("backoffLimit", 0) == 0  # KubeRay (>= 1.6) refuses a retry limit with clusterSelector
    name = service["metadata"]["name"]  # KubeRay: a DNS-1035 label of at most 47 characters
    assert len(name) <= 47 and name[0].isalpha() and all(c.islower() or c.isdigit() or c == "-" for c in name)


def test_security_defaults(rendered, serving, filling):
    for name, objs in {**rendered, "serve": serving, "data": filling}.items():
        assert not [o for o in objs if o["kind"] == "Ingress"], name
        for svc in (o for o in objs if o["kind"] == "Service"):
            assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
        for obj in (o for o in objs if o["kind"] in ("RayCluster", "RayService")):
            cluster = _cluster_spec(obj)
            assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP"  # KubeRay's head and serve Services
            assert cluster["headGroupSpec"].get("enableIngress") is False
            assert cluster["authOptions"]["mode"] == "token"
            assert "serveService" not in obj["spec"] and "headService" not in cluster["headGroupSpec"]
        for obj in objs:
            for pod in _pod_specs(obj):
                where = f"{name}/{obj['kind']}/{obj['metadata']['name']}"
                assert pod["securityContext"]["runAsNonRoot"] is True, where
                assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"), where
                assert pod.get("automountServiceAccountToken") is False, where
                for c in pod["containers"]:
                    sc = c["securityContext"]
                    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], where
                    assert not sc.get("privileged"), where
                    for part in ("requests", "limits"):
                        assert {"cpu", "memory"} <= set(c["resources"][part]), (where, part)
                    for env in c.get("env", []):
                        if any(s in env["name"].upper() for s in SECRET_NAMES):
                            assert "secretKeyRef" in env.get("valueFrom", {}), (where, env["name"])
    for objs in rendered.values():
        ns = _one(objs, "Namespace")
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    mlflow = _one(rendered["postgres-s3"], "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert mlflow["envFrom"] == [{"secretRef": {"name": "mlflow-credentials"}}]  # credentials from a Secret only


def test_network_policies_let_in_the_namespace_and_the_kuberay_operator_only(rendered, serving):
    """Every peer is a pod of the namespace or the KubeRay operator, which reaches the Ray heads on the
    dashboard and Serve ports (a RayJob's status, a RayService's config and proxy health) and nothing else."""
    for objs in rendered.values():
        operator_ports: set[int] = set()
        for policy in (o for o in objs if o["kind"] == "NetworkPolicy"):
            for rule in policy["spec"]["ingress"]:
                for peer in rule["from"]:
                    if "namespaceSelector" not in peer:
                        assert set(peer) == {"podSelector"}, peer  # this namespace's pods
                        continue
                    assert peer["namespaceSelector"]["matchLabels"] == {
                        "kubernetes.io/metadata.name": KUBERAY_OPERATOR["namespace"]
                    }
                    assert peer["podSelector"]["matchLabels"] == KUBERAY_OPERATOR["pod"]
                    assert policy["spec"]["podSelector"]["matchLabels"] == {"ray.io/node-type": "head"}
                    operator_ports |= {p["port"] for p in rule["ports"]}
        heads = [_one(objs, "RayCluster"), _one(serving, "RayService")]
        assert operator_ports == {_head_port(h, n) for h in heads for n in ("dashboard", "serve")}


def _rayjob_args(objs: list[dict[str, Any]]) -> Any:
    """The RayJob's entrypoint parsed as `growpipe train` arguments."""
    argv = shlex.split(_one(objs, "RayJob")["spec"]["entrypoint"])
    assert argv[:2] == ["python", "/home/ray/growpipe/jobs/train.py"]
    return build_parser().parse_args(["train", *argv[2:]])


def _rayjob_config(objs: list[dict[str, Any]]) -> Any:
    """The config the RayJob trains with (its file in the image is this checkout's)."""
    args = _rayjob_args(objs)
    return load_config(REPO / args.config.removeprefix("/home/ray/growpipe/"), args.overrides)


def test_rayjob_entrypoint_is_a_valid_growpipe_train_command(rendered, monkeypatch):
    assert _rayjob_args(rendered["gpu"]).resume == "auto"  # a re-run continues from the newest checkpoint
    cfg = _rayjob_config(rendered["gpu"])
    assert cfg.checkpoint.uri == "/checkpoints" and cfg.grow.every_epochs and cfg.grow.max_blocks
    assert cfg.tracking.register_model and cfg.name == "fashion-mnist-growth"  # the model k8s/serve serves
    mounts = _one(rendered["gpu"], "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in mounts["volumeMounts"]


def test_rayservice_serves_what_growpipe_serve_print_config_prints(rendered, serving, monkeypatch, capsys):
    """serveConfigV2 is Serve's deploy schema, and exactly what `growpipe serve ... --print-config` prints for
    the source and options in the manifest's annotation, so the manifest cannot drift from the code."""
    from ray.serve.schema import ServeDeploySchema

    service = _one(serving, "RayService")
    text = service["spec"]["serveConfigV2"]
    schema = ServeDeploySchema.model_validate(yaml.safe_load(text))
    assert [a.import_path for a in schema.applications] == ["growpipe.serve.app:build_app"]

    source = Source("model", "models:/fashion-mnist-growth/1", "http://mlflow:5000")
    options = ServeOptions(host="0.0.0.0", port=8000, min_replicas=1, max_replicas=4, cpus_per_replica=1.0)
    assert yaml.safe_load(text) == serve_config(source, options)

    argv = shlex.split(service["metadata"]["annotations"]["growpipe/serve-config"])
    assert argv[:2] == ["growpipe", "serve"] and argv[-1] == "--print-config"
    resolved = []

    def resolve(run, checkpoint, model, checkpoint_uri, tracking_uri):  # the MLflow server is the cluster's
        resolved.append((run, checkpoint, model, tracking_uri))
        return Source("model", model, tracking_uri)

    monkeypatch.setattr("growpipe.serve.source.resolve", resolve)
    assert main(argv[1:]) == 0
    assert resolved == [(None, None, source.ref, source.tracking_uri)]
    assert capsys.readouterr().out == text  # byte for byte: KubeRay compares the string

    # what the config names exists in the manifests: the MLflow Service, the head's serve port, room for
    # max_replicas on CPU workers (no GPU asked: replicas ask for CPUs only)
    mlflow = next(o for o in rendered["gpu"] if o["kind"] == "Service" and o["metadata"]["name"] == "mlflow")
    assert source.tracking_uri == f"http://mlflow:{mlflow['spec']['ports'][0]['port']}"
    assert _head_port(service, "serve") == schema.http_options.port and schema.http_options.host == "0.0.0.0"
    workers = _cluster_spec(service)["workerGroupSpecs"]
    assert "nvidia.com/gpu" not in str(workers)
    room = sum(w["maxReplicas"] * float(w["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
               for w in workers)  # fmt: skip
    assert room >= options.max_replicas * options.cpus_per_replica


# ---- MLflow: the Host header every pod sends ----------------------------------------------------------------


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _mlflow(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The MLflow server's container."""
    deployment = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "mlflow")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _mlflow_service(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "mlflow")


def _allowed_hosts(container: dict[str, Any], monkeypatch) -> list[str]:
    """The Host patterns an MLflow server started with the container's arguments allows, as MLflow reads them:
    its own `mlflow server` option parsing (which puts --allowed-hosts into the environment), then the list
    its uvicorn app's host check uses."""
    from mlflow.cli import server
    from mlflow.server.fastapi_security import get_allowed_hosts

    assert container["command"] == ["mlflow", "server"]
    monkeypatch.delenv("MLFLOW_SERVER_ALLOWED_HOSTS", raising=False)
    params = server.make_context("server", list(container["args"])).params
    assert params["allowed_hosts"], "the MLflow server has no --allowed-hosts: MLflow 3 refuses Host: mlflow:5000"
    monkeypatch.setenv("MLFLOW_SERVER_ALLOWED_HOSTS", params["allowed_hosts"])
    return get_allowed_hosts()


def _hosts_used(service: dict[str, Any], *object_lists: list[dict[str, Any]]) -> set[str]:
    """Every Host (name[:port]) the manifests reach the MLflow Service at: MLFLOW_TRACKING_URI, serveConfigV2's
    tracking_uri, the serve-config annotation."""
    text = "\n".join(yaml.safe_dump(o) for objs in object_lists for o in objs)
    name = re.escape(service["metadata"]["name"])
    return set(re.findall(rf"https?://({name}(?:\.[a-z0-9.-]+)?(?::\d+)?)", text))


def _service_hosts(service: dict[str, Any]) -> set[str]:
    """The Service's DNS names, as a pod may write them, with and without its port."""
    name, ns, port = service["metadata"]["name"], service["metadata"]["namespace"], service["spec"]["ports"][0]["port"]
    names = [name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
    return {h for n in names for h in (n, f"{n}:{port}")}


def _needed_hosts(objs: list[dict[str, Any]], *others: list[dict[str, Any]]) -> set[str]:
    """What the server must accept: the Service's names (those the manifests use among them), port-forward's
    localhost (k8s/README.md's local port) and the server's own --host:--port (its job runner calls it there)."""
    service = _mlflow_service(objs)
    local = re.search(r"port-forward svc/mlflow (\d+):", (K8S / "README.md").read_text())
    assert local, "k8s/README.md shows no port-forward to the MLflow Service"
    params = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in _mlflow(objs)["args"] if "=" in a}
    own = f"{params['--host']}:{params['--port']}"
    return _hosts_used(service, objs, *others) | _service_hosts(service) | {
        f"localhost:{local.group(1)}", f"127.0.0.1:{local.group(1)}", own}  # fmt: skip


def test_mlflow_allows_the_host_every_pod_sends(rendered, serving, filling, monkeypatch):
    """MLflow 3 answers 403 to a Host it does not allow, and without --allowed-hosts allows localhost and
    private IPs only: `http://mlflow:5000` was refused. In every overlay the server, as MLflow itself parses
    its arguments and matches a Host, allows each name the manifests reach it at and port-forward's, and
    refuses others; the readiness probe asks with the pods' Host on a path the check covers."""
    from mlflow.server.security_utils import HEALTH_ENDPOINTS, get_default_allowed_hosts, is_allowed_host_header

    for name, objs in rendered.items():
        service = _mlflow_service(objs)
        port = service["spec"]["ports"][0]["port"]
        used = _hosts_used(service, objs, serving)
        assert f"mlflow:{port}" in used, (name, used)  # the Ray pods' and the RayService's MLFLOW_TRACKING_URI
        assert not is_allowed_host_header(get_default_allowed_hosts(), f"mlflow:{port}")  # what was broken
        allowed = _allowed_hosts(_mlflow(objs), monkeypatch)
        assert "*" not in allowed, name
        needed = _needed_hosts(objs, serving, filling)
        assert [h for h in sorted(needed) if not is_allowed_host_header(allowed, h)] == [], name
        for host in ("evil.example", "evil.example:5000", "mlflow.growpipe.svc.evil.example:5000", "10.1.2.3:5000"):
            assert not is_allowed_host_header(allowed, host), (name, host)

        probe = _mlflow(objs)["readinessProbe"]["httpGet"]
        assert probe["path"].startswith("/api/") and probe["path"].split("?")[0] not in HEALTH_ENDPOINTS
        headers = {h["name"]: h["value"] for h in probe["httpHeaders"]}
        assert headers["Host"] in used and is_allowed_host_header(allowed, headers["Host"])
        ports = {p["name"]: p["containerPort"] for p in _mlflow(objs)["ports"]}
        assert ports[probe["port"]] == ports[service["spec"]["ports"][0]["targetPort"]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, path: str, host: str, body: str | None = None) -> tuple[int, str]:
    """One HTTP request to 127.0.0.1:port with the given Host header (POST when there is a body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST" if body else "GET", path, body=body, headers={"Host": host, "Content-Type":
                                                                           "application/json"})  # fmt: skip
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def _server_argv(objs: list[dict[str, Any]], store: Path, port: int) -> list[str]:
    """The MLflow container's command line as Kubernetes runs it ($(VAR) from its ConfigMap and env), with
    its volume at `store` and on 127.0.0.1:port instead of 0.0.0.0:5000."""
    container = _mlflow(objs)
    config = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "mlflow-config")
    env = {**config["data"], **_env(container)}
    mount = container["volumeMounts"][0]["mountPath"]
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a).replace(f"{mount}/", f"{store}/")
            for a in container["args"]]  # fmt: skip
    swapped = {"--host": "127.0.0.1", "--port": str(port)}
    out = [f"{a.split('=')[0]}={swapped[a.split('=')[0]]}" if a.split("=")[0] in swapped else a for a in argv]
    assert len([a for a in out if a not in argv]) == 2 and not any(mount + "/" in a for a in out), out
    return [str(Path(sys.executable).with_name("mlflow")), *container["command"][1:], *out]


def _stop(proc: subprocess.Popen) -> None:
    """End the server and the uvicorn worker it started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_mlflow_server_run_with_the_manifest_args_answers_the_pods_host(rendered, serving, filling, mlflow_db,
                                                                        tmp_path):  # fmt: skip
    """`mlflow server` (this venv's MLflow 3) run with the manifest's own arguments on a loopback port: the
    readiness probe as the kubelet sends it, and an API call with each Host a pod or a port-forward sends, get
    200 (a run's first call, creating its experiment, too); an unlisted Host gets 403 while /health stays 200,
    which is why /health is no readiness probe. Only the worker count (1: two cores) and MLflow's background
    job runner (off) differ from the pod, neither of which touches the Host check; the store is the session's
    empty template (tables made once) at the ConfigMap's path under tmp_path."""
    objs = rendered["gpu"]
    assert mlflow_db == f"sqlite:///{tmp_path / 'mlflow.db'}"
    port = _free_port()
    argv = _server_argv(objs, tmp_path, port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}  # only the arguments decide
    env |= {**_env(_mlflow(objs)), "HOME": str(tmp_path), "MLFLOW_WORKERS": "1",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # fmt: skip
    probe = _mlflow(objs)["readinessProbe"]["httpGet"]
    probe_host = next(h["value"] for h in probe["httpHeaders"] if h["name"] == "Host")
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 150  # ~10 s on an idle machine; bounded when it is busy
        status = None
        while status is None:
            assert proc.poll() is None, f"mlflow server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"mlflow server not up in 150 s:\n{log.read_text()[-3000:]}"
            try:
                status, _ = _request(port, probe["path"], probe_host)
            except OSError:
                time.sleep(0.3)
        assert 200 <= status < 400, f"readiness probe answered {status}"  # the kubelet's success range
        for host in sorted(_needed_hosts(objs, serving, filling)):
            assert _request(port, "/api/2.0/mlflow/experiments/search?max_results=1", host)[0] == 200, host
        created = _request(port, "/api/2.0/mlflow/experiments/create", "mlflow:5000", '{"name": "k8s-host-check"}')
        assert created[0] == 200 and "experiment_id" in created[1], created
        status, body = _request(port, probe["path"], "evil.example:5000")
        assert status == 403 and "Invalid Host header" in body
        assert _request(port, "/health", "evil.example:5000")[0] == 200  # exempt: a /health probe stays green
    finally:
        _stop(proc)


# ---- the data volume ------------------------------------------------------------------------------------------


def _fill_container(filling: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(filling, "Job")["spec"]["template"]["spec"]["containers"][0]


def _claim(pod: dict[str, Any], mount: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in pod["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"]


def test_data_job_writes_the_volume_the_ray_pods_read(rendered, filling):
    """k8s/data's Job mounts read-write, at the same path and with the same GROWPIPE_DATA_DIR, the claim every
    Ray pod mounts read-only, runs as their user and group, and checks the growth job's dataset."""
    job = _one(filling, "Job")
    pod = job["spec"]["template"]["spec"]
    fill = _fill_container(filling)
    data_dir = _env(fill)["GROWPIPE_DATA_DIR"]
    job_mount = next(m for m in fill["volumeMounts"] if m["mountPath"] == data_dir)
    assert not job_mount.get("readOnly") and not _claim(pod, job_mount).get("readOnly")
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    for name, objs in rendered.items():
        cluster = _one(objs, "RayCluster")
        for ray_pod in _pod_specs(cluster):
            assert ray_pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsUser"], name
            assert ray_pod["securityContext"]["runAsGroup"] == pod["securityContext"]["runAsGroup"], name
            for c in ray_pod["containers"]:
                assert _env(c)["GROWPIPE_DATA_DIR"] == data_dir, (name, c["name"])
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == data_dir)
                assert mount["readOnly"] is True and _claim(ray_pod, mount)["readOnly"] is True
                assert _claim(ray_pod, mount)["claimName"] == _claim(pod, job_mount)["claimName"], (name, c["name"])
        claim = _claim(pod, job_mount)["claimName"]
        pvc = next(o for o in objs if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == claim)
        assert "ReadWriteMany" in pvc["spec"]["accessModes"], name  # read by every Ray pod at once
        assert _rayjob_config(objs).data.name in _env(fill)["DATASETS"].split(), name


def test_data_job_script_checks_what_was_copied_in(filling, fashion_dir, text_dir, tmp_path):
    """The Job's own command, run here on a folder standing for the volume: it refuses to wait past its
    deadline (one line), passes once the datasets are copied in and the marker touched (the marker removed,
    each dataset's summary printed), and fails naming the folder when a copied file is truncated."""
    fill = _fill_container(filling)
    env = _env(fill)
    volume = tmp_path / "volume"
    volume.mkdir()
    tiny = {"fashion-mnist": fashion_dir, "20newsgroups": text_dir}
    for name in env["DATASETS"].split():
        shutil.copytree(tiny[name], volume / name)  # what `kubectl cp` does
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # this venv's growpipe
    run_env = {**os.environ, **env, "GROWPIPE_DATA_DIR": str(volume), "PATH": path}

    def run(**extra: str) -> subprocess.CompletedProcess:
        argv = [*fill["command"], *fill["args"]]
        return subprocess.run(argv, cwd=tmp_path, env={**run_env, **extra}, capture_output=True, text=True,
                              timeout=180)  # fmt: skip

    marker = volume / ".copied"
    late = run(FILL_TIMEOUT_S="0")
    assert late.returncode == 1 and late.stderr.strip() == (
        f"no {marker} after 0 s: kubectl cp the datasets in and touch it (k8s/README.md)")  # fmt: skip
    marker.touch()
    done = run()
    assert done.returncode == 0, done.stderr
    assert "fashion-mnist: image, train 40" in done.stdout and f"filled: {env['DATASETS']}" in done.stdout
    assert not marker.exists()
    images = volume / "fashion-mnist" / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:100])  # a copy cut short
    marker.touch()
    cut = run()
    assert cut.returncode == 1 and "filled" not in cut.stdout
    assert cut.stderr.strip().splitlines()[-1].startswith(f"{volume}/fashion-mnist: does not load"), cut.stderr


def test_readme_command_blocks_are_marked_as_needing_a_cluster():
    """No test runs k8s/README.md's command blocks (each needs a Kubernetes cluster): each says so directly
    above it, in the form the docs test reads."""
    lines = (K8S / "README.md").read_text().splitlines()
    opening, inside = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            if not inside:
                opening.append(i)
            inside = not inside
    assert opening and not inside
    assert [lines[i] for i in opening if lines[i - 1] != NO_CLUSTER] == []
