"""No gradient crosses a block boundary for the local rules."""

import pytest
import torch

from growpipe.data import iterate_batches, load_data
from growpipe.nn.net import GrowableNet
from growpipe.nn.specs import InputInfo
from tests.conftest import tiny_config


@pytest.mark.parametrize("method", ["al", "scpl", "dascpl"])
@pytest.mark.parametrize("backbone", ["mlp", "cnn"])
def test_loss_of_block_j_changes_no_gradient_of_other_blocks(method, backbone):
    cfg = tiny_config(method=method, net={"backbone": backbone, "blocks": 3, "width": 32})
    bundle = load_data(cfg.data)
    torch.manual_seed(0)
    net = GrowableNet.build(cfg.rule(), cfg.net, InputInfo.from_bundle(bundle))
    p = next(iterate_batches(bundle.train, 32, shuffle=False))
    for j, block in enumerate(net.blocks):
        for b in net.blocks:
            for prm in b.parameters():
                prm.grad = None
        before = {i: [prm.detach().clone() for prm in b.parameters()] for i, b in enumerate(net.blocks)}
        out, metrics = block.train_step(p)
        assert metrics, "a trainable block reports its losses"
        assert not out.x.requires_grad and (out.t is None or not out.t.requires_grad)
        for i, b in enumerate(net.blocks):
            grads = [prm.grad for prm in b.parameters()]
            if i == j:
                assert any(g is not None and g.abs().sum() > 0 for g in grads)
            else:
                assert all(g is None for g in grads), f"block {j}'s loss reached block {i}"
                assert all(torch.equal(a, c) for a, c in zip(before[i], b.parameters(), strict=True))
        p = out


def test_dependencies_point_downward():
    """nn/ never imports Ray, the loop, the runtime or the whole run config; loop/ never imports Ray, the
    runtime or tracking (imports inside functions included)."""
    import ast

    from tests.conftest import REPO

    rules = {"nn": ("ray", "growpipe.loop", "growpipe.runtime", "growpipe.tune", "growpipe.tracking"),
             "loop": ("ray", "growpipe.runtime", "growpipe.tune", "growpipe.tracking")}  # fmt: skip
    for package, banned in rules.items():
        for path in (REPO / "src" / "growpipe" / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                    if package == "nn" and node.module == "growpipe.config":
                        assert "RunConfig" not in {a.name for a in node.names}, f"{path.name} reads a RunConfig"
                bad = [n for n in names if n == "ray" or n.startswith(("ray.", *(b for b in banned if b != "ray")))]
                assert not bad, f"{package}/{path.name} imports {bad}"
