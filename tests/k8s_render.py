"""Render a kustomize overlay: `kubectl kustomize` when kubectl is installed, else a small Python builder
for exactly the features k8s/ uses (resources, namespace, labels, images, JSON-6902 patches, $patch: delete).
The tests check the two agree wherever kubectl exists."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml


def render(path: Path) -> list[dict[str, Any]]:
    """The objects an overlay (or base) directory renders to."""
    if shutil.which("kubectl"):
        return render_with_kubectl(path)
    return render_in_python(path)


def render_with_kubectl(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def render_in_python(path: Path) -> list[dict[str, Any]]:
    k = yaml.safe_load((path / "kustomization.yaml").read_text())
    objs: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        target = path / res
        if target.is_dir():
            objs += render_in_python(target)
        else:
            objs += [d for d in yaml.safe_load_all(target.read_text()) if d]
    for p in k.get("patches", []):
        body = yaml.safe_load(p["patch"])
        for obj in objs:
            if _matches(obj, p["target"]):
                if isinstance(body, dict) and body.get("$patch") == "delete":
                    obj["__deleted__"] = True
                else:
                    for op in body:
                        _apply(obj, op)
    objs = [o for o in objs if not o.get("__deleted__")]
    for obj in objs:
        if "namespace" in k and obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = k["namespace"]
        for lab in k.get("labels", []):
            obj["metadata"].setdefault("labels", {}).update(lab["pairs"])
        for img in k.get("images", []):
            _set_images(obj, img)
    return objs


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    return (
        obj["kind"] == target.get("kind", obj["kind"])
        and obj["metadata"]["name"] == target.get("name", obj["metadata"]["name"])
        and group == target.get("group", group)
        and version == target.get("version", version)
    )


def _apply(obj: dict[str, Any], op: dict[str, Any]) -> None:
    *parents, last = [int(p) if p.isdigit() else p for p in op["path"].strip("/").split("/")]
    node: Any = obj
    for part in parents:
        node = node[part]
    if op["op"] == "remove":
        del node[last]
    elif op["op"] in ("replace", "add"):
        node[last] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"patch op {op['op']!r} is not supported by the Python builder")


def _set_images(node: Any, img: dict[str, Any]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str) and value.split(":")[0] == img["name"]:
                name = img.get("newName", img["name"])
                tag = img.get("newTag", value.split(":", 1)[1] if ":" in value else None)
                node[key] = f"{name}:{tag}" if tag else name
            else:
                _set_images(value, img)
    elif isinstance(node, list):
        for item in node:
            _set_images(item, img)
