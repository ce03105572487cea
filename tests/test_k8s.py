"""k8s/ manifests: every overlay renders; RayCluster and RayJob validate against KubeRay's CRD schemas (unknown
fields rejected); core objects against Kubernetes' schemas; KubeRay's own rules; the security defaults; and
the RayJob's entrypoint is a valid `growpipe train` command line."""

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

from growpipe.cli import build_parser
from growpipe.config import load_config
from tests.k8s_render import render, render_in_python, render_with_kubectl

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
CRDS = REPO.parent / "shared" / "kuberay-crds"
OVERLAYS = ["gpu", "cpu", "postgres-s3"]
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


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Deployment":
        return [spec["template"]["spec"]]
    if obj["kind"] == "RayCluster":
        return [spec["headGroupSpec"]["template"]["spec"]] + [w["template"]["spec"] for w in spec["workerGroupSpecs"]]
    if obj["kind"] == "RayJob":
        return [spec["submitterPodTemplate"]["spec"]]
    return []


def test_every_overlay_renders_the_whole_service(rendered):
    for name, objs in rendered.items():
        kinds = sorted(o["kind"] for o in objs)
        assert {"RayCluster", "RayJob", "Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy"} <= set(kinds)
        assert all(o["metadata"].get("namespace") == "growpipe" for o in objs if o["kind"] != "Namespace"), name
    gpu = _one(rendered["gpu"], "RayCluster")["spec"]["workerGroupSpecs"][0]
    cpu = _one(rendered["cpu"], "RayCluster")["spec"]["workerGroupSpecs"][0]
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in str(cpu) and cpu["groupName"] == "cpu"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: only the Python builder runs")
def test_python_builder_agrees_with_kubectl_kustomize():
    for o in OVERLAYS:
        key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
        assert sorted(render_in_python(K8S / "overlays" / o), key=key) == sorted(
            render_with_kubectl(K8S / "overlays" / o), key=key
        ), o


def test_raycluster_and_rayjob_match_the_kuberay_crds(rendered):
    for objs in rendered.values():
        for kind in ("RayCluster", "RayJob"):
            obj = _one(objs, kind)
            assert obj["apiVersion"] == "ray.io/v1"
            assert _errors(obj) == [], kind


def test_crd_check_catches_a_misspelled_field_and_a_wrong_type(rendered):
    cluster = copy.deepcopy(_one(rendered["gpu"], "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["maxReplica"] = 8  # misspelled
    cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = "zero"  # wrong type
    errors = _errors(cluster)
    assert any("maxReplica" in e and "not allowed" in e for e in errors), errors
    assert any("minReplicas" in e and "is not of type 'integer'" in e for e in errors), errors
    job = copy.deepcopy(_one(rendered["gpu"], "RayJob"))
    job["spec"]["backofLimit"] = 3
    assert any("backofLimit" in e for e in _errors(job))


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


def test_kuberay_rules_hold(rendered):
    pinned = next(line for line in (REPO / "pyproject.toml").read_text().splitlines() if '"ray[' in line)
    for objs in rendered.values():
        spec = _one(objs, "RayCluster")["spec"]
        assert pinned.split("<")[-1].startswith(spec["rayVersion"].rsplit(".", 1)[0][:3])  # same Ray line as the code
        assert spec["enableInTreeAutoscaling"] is True
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no stage on the head
        names = [w["groupName"] for w in spec["workerGroupSpecs"]]
        assert len(names) == len(set(names))
        for w in spec["workerGroupSpecs"]:
            assert 0 <= w["minReplicas"] <= w.get("replicas", w["minReplicas"]) <= w["maxReplicas"]
        job = _one(objs, "RayJob")["spec"]
        assert job["clusterSelector"]["ray.io/cluster"] == _one(objs, "RayCluster")["metadata"]["name"]
        assert job["backoffLimit"] >= 1  # re-run after a head loss, resuming from the checkpoint


def test_security_defaults(rendered):
    for name, objs in rendered.items():
        assert not [o for o in objs if o["kind"] == "Ingress"], name
        for svc in (o for o in objs if o["kind"] == "Service"):
            assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
        cluster = _one(objs, "RayCluster")["spec"]
        assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP"
        assert cluster["headGroupSpec"].get("enableIngress") is False
        assert cluster["authOptions"]["mode"] == "token"
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
        ns = _one(objs, "Namespace")
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    mlflow = _one(rendered["postgres-s3"], "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert mlflow["envFrom"] == [{"secretRef": {"name": "mlflow-credentials"}}]  # credentials from a Secret only


def test_rayjob_entrypoint_is_a_valid_growpipe_train_command(rendered, monkeypatch):
    job = _one(rendered["gpu"], "RayJob")["spec"]
    argv = shlex.split(job["entrypoint"])
    assert argv[:2] == ["python", "/home/ray/growpipe/jobs/train.py"]
    args = build_parser().parse_args(["train", *argv[2:]])
    assert args.resume == "auto"  # a re-run continues from the newest checkpoint
    cfg = load_config(REPO / args.config.removeprefix("/home/ray/growpipe/"), args.overrides)
    assert cfg.checkpoint.uri == "/checkpoints" and cfg.grow.every_epochs and cfg.grow.max_blocks
    mounts = _one(rendered["gpu"], "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in mounts["volumeMounts"]
