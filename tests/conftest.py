"""Shared helpers: small configs and data files written by the tests themselves."""

from __future__ import annotations

import copy
import gzip
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from growpipe.config import RunConfig, build_config

REPO = Path(__file__).resolve().parents[1]


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_config(**sections: Any) -> RunConfig:
    """A fast digits config (64-wide MLP, 2 blocks, 1 epoch) with `sections` merged in."""
    base = {
        "data": {"name": "digits", "batch_size": 64},
        "net": {"backbone": "mlp", "blocks": 2, "width": 64},
        "train": {"epochs": 1},
        "al": {"code_dim": 16},
        "scpl": {"proj_dim": 16},
        "tracking": {"mlflow": False},
        "checkpoint": {"enabled": False},
    }
    return build_config(deep_merge(base, sections))


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as a gzipped IDX file."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def fashion_dir(tmp_path: Path) -> Path:
    """A tiny Fashion-MNIST directory: 40 train and 20 test 28x28 images."""
    rng = np.random.default_rng(0)
    d = tmp_path / "fmnist"
    d.mkdir()
    write_idx(d / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (40, 28, 28)))
    write_idx(d / "train-labels-idx1-ubyte.gz", np.arange(40) % 10)
    write_idx(d / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (20, 28, 28)))
    write_idx(d / "t10k-labels-idx1-ubyte.gz", np.arange(20) % 10)
    return d


def text_frames(n_train: int = 60, n_test: int = 30) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Three topics whose documents use topic words, so a tiny text model can learn them."""
    words = [["ball", "goal", "team", "score"], ["cpu", "disk", "linux", "kernel"], ["god", "church", "faith", "bible"]]
    rng = np.random.default_rng(1)

    def make(n: int) -> pd.DataFrame:
        labels = np.arange(n) % 3
        texts = [" ".join(rng.choice(words[y], 12)) + " the and of" for y in labels]
        return pd.DataFrame({"text": texts, "label": labels, "label_name": [f"topic{y}" for y in labels]})

    return make(n_train), make(n_test)


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    """A directory with train.parquet and test.parquet (text, label, label_name)."""
    d = tmp_path / "news"
    d.mkdir()
    train, test = text_frames()
    train.to_parquet(d / "train.parquet")
    test.to_parquet(d / "test.parquet")
    return d


@pytest.fixture(scope="session")
def digits_on_disk(tmp_path_factory) -> str:
    """The digits bundle as parquet pixel lists, read from disk per batch: `data.name` of a streamed split."""
    from growpipe.config import DataSpec
    from growpipe.data.sources import load_digits_bundle

    bundle = load_digits_bundle(DataSpec(name="digits", normalize="none"))
    root = tmp_path_factory.mktemp("digits-parquet")
    for split in ("train", "test"):
        part = getattr(bundle, split)
        pixels = [row.reshape(-1).tolist() for row in part.x.numpy()]
        pd.DataFrame({"pixels": pixels, "label": part.y.numpy()}).to_parquet(root / f"{split}.parquet")
    return f"parquet:{root}"


def pytest_configure(config: pytest.Config) -> None:
    """Before `make test`'s worker processes start (pytest-xdist): a Ray auth token in ~/.ray/auth_token when
    there is none, so that the first local Rays of two workers do not each write one of their own there, the
    later one locking commands out of the earlier one's cluster."""
    if hasattr(config, "workerinput") or os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    if not (Path.home() / ".ray" / "auth_token").exists():
        from ray._private.authentication.authentication_token_setup import generate_and_save_token

        generate_and_save_token()


@pytest.fixture(scope="session", autouse=True)
def _runs_outside_the_checkout(tmp_path_factory):
    """A run's relative paths (runs/checkpoints, runs/mlflow.db) in every test go to a temporary folder, not
    into this checkout (tests that are about GROWPIPE_WORKDIR set their own)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GROWPIPE_WORKDIR", str(tmp_path_factory.mktemp("workdir")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def _mlflow_template(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store, its tables created once per session (seconds of schema migrations)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_db(tmp_path: Path, _mlflow_template: Path) -> str:
    """`tmp_path/mlflow.db`, an empty MLflow store (a copy of the session's template); its sqlite URI."""
    import shutil

    shutil.copyfile(_mlflow_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def pipeline_matches_reference(cfg: RunConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train `cfg` on the reference trainer and on the Ray pipeline; assert the same weights (atol 1e-6) and
    return (the pipeline's result, the reference's summary)."""
    from growpipe.local import train_local
    from growpipe.runtime.pipeline import Pipeline

    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-6)
    return result, reference.summary()


def assert_same_weights(net_a, net_b, atol: float = 0.0) -> None:
    """Every block of two nets: the same step count, weights and optimizer state (within `atol`)."""
    for a, b in zip(net_a.state_dict()["blocks"], net_b.state_dict()["blocks"], strict=True):
        assert a["steps"] == b["steps"]
        for k, v in a["modules"].items():
            w = b["modules"][k]
            assert torch.allclose(v, w, atol=atol, rtol=0), f"{k} differs by {(v - w).abs().max():.3g}"
        for name, opt in a["optimizers"].items():
            for pid, st in opt["state"].items():
                for key, val in st.items():
                    if torch.is_tensor(val):
                        assert torch.allclose(val, b["optimizers"][name]["state"][pid][key], atol=atol, rtol=0)


def run_actors(run: str) -> list[str]:
    """The names of run `run`'s actors still alive: its controllers that answer ("RUN@ATTEMPT": the name of one
    that exited can outlive it while handles to it exist) and its stage actors ("RUN@ATTEMPT/stageK", killed
    outright: their names go with them)."""
    import ray

    from growpipe.runtime import NAMESPACE
    from growpipe.runtime.names import controllers

    named = ray.util.list_named_actors(all_namespaces=True)
    stages = [a["name"] for a in named if a.get("namespace") == NAMESPACE and a["name"].startswith(f"{run}@")
              and "/stage" in a["name"]]  # fmt: skip
    return [name for name, _, _ in controllers(run)] + stages


def _session_ray() -> None:
    import ray

    from growpipe.runtime import NAMESPACE

    ray.init(address="local", num_cpus=4, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray per pytest process (4 logical CPUs: room for a few 1-CPU stages); `make test` runs two
    processes (pytest-xdist, whole files each: a module's fixtures stay in one process)."""
    import ray

    if not ray.is_initialized():
        _session_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def multinode():
    """A Ray cluster of three raylets on this machine (growpipe.runtime.raylets): a head with no CPU and two
    1-CPU workers; tests remove and add workers. The session's Ray is stopped meanwhile and started again
    afterwards."""
    import ray

    from growpipe.runtime.raylets import raylet_cluster

    was_up = ray.is_initialized()
    if was_up:
        ray.shutdown()
    try:
        with raylet_cluster() as cluster:
            yield cluster
    finally:
        if was_up:
            _session_ray()
