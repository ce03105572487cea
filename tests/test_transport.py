"""pipeline.transport: the backend decision, the refusals before Ray starts, packets split for a direct transport,
and one Ray run whose activations go by gloo (Ray Direct Transport) ending with the reference trainer's weights."""

import pytest
import ray
import torch

from growpipe.cli import main
from growpipe.local import train_local
from growpipe.nn.packet import Packet
from growpipe.runtime.pipeline import Pipeline
from growpipe.runtime.transport import join_packets, resolve, split_packets, transport_problem
from tests.conftest import assert_same_weights, tiny_config


@pytest.mark.parametrize(
    ("setting", "method", "device", "gpus", "backend"),
    [
        ("object_store", "al", "auto", 1, "object_store"),
        ("auto", "scpl", "auto", 1, "nccl"),  # every stage has a whole GPU
        ("auto", "scpl", "auto", 0.5, "object_store"),  # stages share a GPU: NCCL takes one rank per GPU
        ("auto", "scpl", "auto", 0, "object_store"),
        ("auto", "scpl", "cpu", 1, "object_store"),  # tensors stay on the CPU
        ("auto", "bp", "auto", 1, "object_store"),
        ("gloo", "dascpl", "auto", 0, "gloo"),
        ("nccl", "al", "auto", 1, "nccl"),
    ],
)
def test_backend_follows_the_setting_and_the_stage_gpus(setting, method, device, gpus, backend):
    assert resolve(setting, method, device, gpus) == backend


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ({"pipeline": {"transport": "nccl"}, "runtime": {"gpus_per_stage": 0}}, "nccl sends tensors between GPUs but "
         "runtime.gpus_per_stage is 0; use gloo between CPU stages"),
        ({"pipeline": {"transport": "nccl"}, "device": "cpu"}, "nccl sends tensors between GPUs but device is cpu"),
        ({"pipeline": {"transport": "nccl"}, "runtime": {"gpus_per_stage": 0.5}}, "nccl needs a whole GPU per stage"),
    ],
)  # fmt: skip
def test_a_transport_the_config_cannot_use_is_one_line(sections, needle):
    why = transport_problem(tiny_config(**sections))
    assert why is not None and needle in why and "\n" not in why
    assert why.startswith("pipeline.transport: ")


@pytest.mark.parametrize(
    "sections", [{"pipeline": {"transport": t}} for t in ("object_store", "auto", "compiled", "gloo")]
)
def test_usable_transports_pass(sections):
    assert transport_problem(tiny_config(**sections)) is None


def test_nccl_without_gpus_exits_2_before_ray_starts(capsys):
    was_up = ray.is_initialized()
    args = ["train", "--set", "pipeline.transport=nccl", "--set", "runtime.gpus_per_stage=0", "--set",
            "tracking.mlflow=false", "--set", "checkpoint.enabled=false"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "pipeline.transport: nccl sends tensors between GPUs but runtime.gpus_per_stage is 0" in err
    assert ray.is_initialized() == was_up


def test_packets_split_into_layouts_and_tensors_and_back():
    a = Packet(x=torch.randn(3, 4).t(), y=torch.arange(4), index=7)  # a transposed (non-contiguous) x
    b = Packet(x=torch.randn(2, 5), t=torch.randn(2, 3), mask=torch.ones(2, 5, dtype=torch.bool),
               side={"band1": torch.randn(2, 2), "band2": torch.randn(2, 1)}, index=8)  # fmt: skip
    layouts, tensors = split_packets([a, b], "cpu")
    assert layouts == [(7, ("x", "y"), ()), (8, ("x", "t", "mask"), ("band1", "band2"))]
    assert len(tensors) == 7 and all(t.is_contiguous() for t in tensors)
    back = join_packets(layouts, tensors)
    for old, new in zip([a, b], back, strict=True):
        assert new.index == old.index and list(new.side) == list(old.side)
        for f in ("x", "y", "t", "mask"):
            v, w = getattr(old, f), getattr(new, f)
            assert (v is None and w is None) or (torch.equal(v, w) and v.dtype == w.dtype)
        assert all(torch.equal(old.side[k], new.side[k]) for k in old.side)
    with pytest.raises(ValueError, match="8 tensors arrived for layouts that take 7"):
        join_packets(layouts, [*tensors, torch.zeros(1)])


@pytest.mark.usefixtures("ray_session")
def test_gloo_pipeline_matches_the_reference_trainer_through_growth():
    """AL (packets carry label codes), two packets per call, and a growth that makes the group again over
    three actors; every stage after the first got its tensors by gloo."""
    cfg = tiny_config(name="transport-gloo", method="al", threads=1, data={"limit_train": 320, "batch_size": 32},
                      net={"width": 32}, train={"epochs": 2}, grow={"every_epochs": 1, "max_blocks": 3},
                      pipeline={"transport": "gloo", "packets_per_call": 2, "window": 4})  # fmt: skip
    reference = train_local(cfg, progress=None)
    with Pipeline(cfg) as p:
        result = p.train(progress=None)
        net = p.final_net()
    assert_same_weights(reference.net, net, atol=1e-6)
    assert result["blocks"] == 3
    t = result["transport"]
    assert t["backend"] == "gloo" and t["groups_made"] == 2
    assert t["direct_pushes"][0] == 0 and all(n > 0 for n in t["direct_pushes"][1:])
