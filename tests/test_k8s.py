"""k8s/ manifests: every overlay (and k8s/serve) renders; RayCluster, RayJob and RayService validate against
KubeRay's CRD schemas (unknown fields rejected); core objects against Kubernetes' schemas; KubeRay's own rules;
the security defaults; the RayJob's entrypoint is a valid `growpipe train` command line; and the RayService's
serveConfigV2 is what `growpipe serve --print-config` prints."""

from __future__ import annotations

import copy
import functools
import shlex
import shutil
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


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def _cluster_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The Ray cluster a RayCluster or a RayService describes."""
    return obj["spec"]["rayClusterConfig"] if obj["kind"] == "RayService" else obj["spec"]


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Deployment":
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


def test_every_overlay_renders_the_whole_service(rendered, serving):
    for name, objs in rendered.items():
        kinds = sorted(o["kind"] for o in objs)
        assert {"RayCluster", "RayJob", "Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy"} <= set(kinds)
        assert all(o["metadata"].get("namespace") == "growpipe" for o in objs if o["kind"] != "Namespace"), name
    gpu = _one(rendered["gpu"], "RayCluster")["spec"]["workerGroupSpecs"][0]
    cpu = _one(rendered["cpu"], "RayCluster")["spec"]["workerGroupSpecs"][0]
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in str(cpu) and cpu["groupName"] == "cpu"
    assert [(o["kind"], o["metadata"]["namespace"]) for o in serving] == [("RayService", "growpipe")]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: only the Python builder runs")
def test_python_builder_agrees_with_kubectl_kustomize():
    for path in [K8S / "overlays" / o for o in OVERLAYS] + [SERVE]:
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


def test_core_objects_match_the_kubernetes_schemas(rendered):
    version = kubernetes_validate.utils.latest_version()
    for objs in rendered.values():
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


def test_security_defaults(rendered, serving):
    for name, objs in {**rendered, "serve": serving}.items():
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


def test_rayjob_entrypoint_is_a_valid_growpipe_train_command(rendered, monkeypatch):
    job = _one(rendered["gpu"], "RayJob")["spec"]
    argv = shlex.split(job["entrypoint"])
    assert argv[:2] == ["python", "/home/ray/growpipe/jobs/train.py"]
    args = build_parser().parse_args(["train", *argv[2:]])
    assert args.resume == "auto"  # a re-run continues from the newest checkpoint
    cfg = load_config(REPO / args.config.removeprefix("/home/ray/growpipe/"), args.overrides)
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
