"""The Ray Serve application: replicas that answer classification requests with a net, reloading it in place.

    POST /predict   {"inputs": [[...], ...], "threshold": 0.9, "confidence": "max_prob"}
                 -> {"prediction": [...], "exit_depth": [...], "confidence": [...], "version": {...}}
    GET  /version   the version every answer of this replica carries (run, checkpoint, epoch, blocks)

Which net a replica serves is its deployment's `user_config` ({"source": a checkpoint directory or an MLflow
model URI, ...}); a new version is deployed as a new user_config, which Serve applies replica by replica
through `reconfigure` without restarting them (a lightweight update). `reconfigure` loads the new net beside
the old one and swaps it in one assignment: a request is answered wholly by one version. A version that fails
to load is logged and refused; the replica keeps serving the previous one.

Requests are batched (`@serve.batch`, counted in rows); every row runs real early exit
(growpipe.serve.predictor), so a sample confident at block k never runs the blocks above it.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import torch
from ray import serve
from starlette.responses import JSONResponse

from growpipe.errors import GrowpipeError, InputError
from growpipe.nn.inference import Exited
from growpipe.nn.packet import Packet
from growpipe.quiet import quiet_libraries
from growpipe.serve.groups import BlockGroupNet
from growpipe.serve.predictor import Predictor
from growpipe.serve.request import PredictRequest, parse_body, parse_request
from growpipe.serve.source import model_files
from growpipe.serving import quiet_mlflow

log = logging.getLogger("ray.serve")
INGRESS = "NetServer"
MAX_BATCH_ROWS = 1024


def checkpoint_of(user_config: dict[str, Any]) -> str | Path:
    """The checkpoint directory a user_config names: itself, or an MLflow model's (downloaded here)."""
    source = user_config["source"]
    if user_config.get("kind") != "model":
        return source
    from mlflow.artifacts import download_artifacts

    tracking = user_config.get("tracking_uri")
    with quiet_mlflow():  # no download bar in the replica's output
        local = Path(download_artifacts(artifact_uri=model_files(source, tracking), tracking_uri=tracking,
                                        dst_path=tempfile.mkdtemp(prefix="growpipe-model-")))  # fmt: skip
    found = sorted(p.parent for p in local.rglob("manifest.json"))
    if not found:
        raise GrowpipeError(f"{source}: the model holds no growpipe checkpoint (artifacts/checkpoint)")
    return found[0]


def load_version(user_config: dict[str, Any], staged: bool) -> Predictor:
    """What a NetServer replica loads: the whole net, or (its blocks served as groups) only its inputs."""
    checkpoint = checkpoint_of(user_config)
    return Predictor.front(checkpoint) if staged else Predictor.load(checkpoint)


@serve.deployment(name="BlockGroup", max_ongoing_requests=64, health_check_period_s=5)
class BlockGroup:
    """Group `index` of `groups` (growpipe.serve.groups): its own blocks only; runs early exit on them and
    passes the undecided rows to the next group's handle. Each request names its version (the ingress's), and
    a group answers it with that version, loading it first if its reconfigure has not come yet: every block
    of one answer is of one version. It keeps the two newest versions."""

    def __init__(self, index: int, groups: int, next_group: Any = None):
        quiet_libraries()
        self.index, self.groups, self.next = index, groups, next_group
        self.nets: dict[str, Any] = {}

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._net(user_config)

    def _net(self, user_config: dict[str, Any]) -> Any:
        source = user_config["source"]
        if source not in self.nets:
            net = BlockGroupNet.load(checkpoint_of(user_config), self.groups, self.index)
            self.nets = {**dict(list(self.nets.items())[-1:]), source: net}  # one assignment, the two newest
        return self.nets[source]

    async def run(self, user_config: dict[str, Any], p: Any, threshold: float | None, kind: str) -> Any:
        """Early exit of the rows of packet `p` from this group on: every row's answer, ordered by row."""
        exited, rest = self._net(user_config).run(p, threshold, kind)
        if rest is None or self.next is None:
            return exited
        return Exited.cat([exited, await self.next.run.remote(user_config, rest, threshold, kind)])


@serve.deployment(name=INGRESS, max_ongoing_requests=64, health_check_period_s=5)
class NetServer:
    """A replica: one loaded net (the version its user_config names), batched early-exit answers."""

    def __init__(self, first_group: Any = None) -> None:
        quiet_libraries()  # MLflow's lines when it fetches a model; Serve's batch-size warning (rows, not requests)
        self.first_group = first_group  # the blocks are served as groups (--stages > 1): the chain's head
        self.current: tuple[dict[str, Any], Predictor] | None = None  # (user_config, its net): one assignment
        self.refused: dict[str, str] = {}

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Load the version `user_config` names and swap it in; a failure keeps the previous version (and
        fails only a replica that has none yet, which Serve then replaces)."""
        source = user_config["source"]
        if self.current is not None and source == self.current[0]["source"]:
            return
        t0 = time.perf_counter()
        try:
            loaded = load_version(user_config, staged=self.first_group is not None)
        except Exception as e:
            if self.current is None:
                raise
            self.refused[source] = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            log.warning("growpipe: refused %s (%s); still serving %s", source, self.refused[source],
                        self.current[0]["source"])  # fmt: skip
            return
        self.current = (dict(user_config), loaded)  # a request takes self.current once: old net or new
        log.info("growpipe: serving %s (%d blocks), loaded in %.2f s", source, loaded.version.blocks,
                 time.perf_counter() - t0)  # fmt: skip

    def status(self) -> dict[str, Any]:
        """What this replica serves and what it refused (the follower reads it)."""
        assert self.current is not None
        config, predictor = self.current
        return {"source": config["source"], "version": predictor.version.to_dict(), "refused": dict(self.refused)}

    async def predict(self, request: dict[str, Any] | PredictRequest) -> dict[str, Any]:
        """The Python handle's entry: a request's fields as a dict (or a PredictRequest); InputError when bad."""
        req = request if isinstance(request, PredictRequest) else parse_request(request)
        assert self.current is not None
        config, predictor = self.current
        x, side = predictor.inputs(req.inputs, req.side)
        item = (config, predictor, x, side, req.threshold, req.confidence)
        if len(x) > MAX_BATCH_ROWS:  # a batch by itself
            return (await self._compute([item]))[0]
        return await self._answer(item)

    async def __call__(self, http: Any) -> Any:
        path = http.url.path.rstrip("/").rpartition("/")[2]
        if http.method == "GET" and path in ("version", ""):
            return JSONResponse(self.status())
        if http.method != "POST" or path != "predict":
            return JSONResponse({"error": f"{http.method} {http.url.path}: use POST /predict or GET /version"},
                                status_code=404)  # fmt: skip
        try:
            return JSONResponse(await self.predict(parse_body(await http.body())))
        except InputError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

    @serve.batch(max_batch_size=MAX_BATCH_ROWS, batch_wait_timeout_s=0.002, batch_size_fn=lambda items: sum(
        len(item[2]) for item in items))  # fmt: skip
    async def _answer(self, items: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """Requests batched together (at most MAX_BATCH_ROWS rows)."""
        return await self._compute(items)

    async def _compute(self, items: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """Answers for requests: those with the same net and options run as one early-exit pass."""
        out: list[dict[str, Any]] = [{}] * len(items)
        groups: dict[tuple[int, float, str], list[int]] = {}
        for i, (_, predictor, _, _, threshold, kind) in enumerate(items):
            groups.setdefault((id(predictor), float(threshold), kind), []).append(i)
        for members in groups.values():  # the same net: the same input shape and side groups
            config, predictor, _, side, threshold, kind = items[members[0]]
            x = torch.cat([items[i][2] for i in members])
            joined = {k: torch.cat([items[i][3][k] for i in members]) for k in side}
            if self.first_group is None:
                exited = predictor.early_exit(x, joined, threshold, kind)
            else:
                exited = await self.first_group.run.remote(config, Packet(x=predictor.standardised(x), side=joined,
                    rows=torch.arange(len(x))), None if threshold >= 1.0 else threshold, kind)  # fmt: skip
            for i, answer in zip(members, predictor.answers(exited, [len(items[i][2]) for i in members]), strict=True):
                out[i] = answer
        return out


def group_name(index: int) -> str:
    """The deployment name of block group `index`."""
    return f"BlockGroup{index}"


def build_app(args: dict[str, Any]) -> Any:
    """The application (Serve's import path growpipe.serve.app:build_app). args: {"stages": S} serves the
    blocks as S groups, chained by handles behind the ingress (default 1: the whole net in each replica)."""
    # mypy keeps a decorated class's own type: @serve.deployment made these Deployments
    ingress, group = cast(serve.Deployment, NetServer), cast(serve.Deployment, BlockGroup)
    stages = int(args.get("stages", 1))
    if stages < 2:
        return ingress.bind()
    head = None
    for i in reversed(range(stages)):
        head = group.options(name=group_name(i)).bind(i, stages, head)
    return ingress.bind(head)
