"""Every cell of the README's interoperability table runs as printed.

For each row the test writes the row's file `p` (tiny weights in that project's key names and shapes, `N`
classes), then evaluates every code span of the row that is a call, exactly as the README prints it, with
`m`, `p`, `N`, `resmlp` and `timm` defined. The one substitution: `create_model` builds our names at a tiny
size (their size keywords are added; `num_classes` never is, so a row that needs it must say it); timm's own
`resmlp_12_224` fixes its sizes, so that one cell runs at full size. A cell into the DeiT or DINO repository is
checked by loading the written file as that project's code does (the twins in tests/test_timm_weights.py).
Every model a cell returns must give the source's outputs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import timm
import torch
from conftest import make_trained_like_
from test_timm_weights import SMALL, DeitResMLP, _timm_resmlp

import resmlp
from resmlp.models import registry

ROOT = Path(__file__).resolve().parents[1]
X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
N = 3


def table_rows() -> dict[str, list[list[str]]]:
    """The table's rows: the first cell's words -> the code spans of every other cell."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Interoperability: what loads where", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| from") or line.startswith("|---"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0].split(" (")[0]] = [re.findall(r"`([^`]+)`", cell) for cell in cells[1:]]
    return rows


def calls(spans: list[str]) -> list[str]:
    """The spans that are Python calls (the others name things: a key, another project's function)."""
    out = []
    for span in spans:
        try:
            tree = ast.parse(span, mode="eval")
        except SyntaxError:
            continue
        if isinstance(tree.body, ast.Call):
            out.append(span)
    return out


def _tiny(create, sizes_of):
    def create_model(name, *args, **kwargs):
        return create(name, *args, **{**sizes_of(name), **kwargs})
    return create_model


def namespace(m, p, n):
    sizes = lambda name: {} if name.endswith("_224") else SMALL  # noqa: E731 - timm's own names fix their sizes
    tiny_timm = SimpleNamespace(create_model=_tiny(timm.create_model, sizes), models=timm.models)
    tiny_resmlp = SimpleNamespace(**{k: getattr(resmlp, k) for k in ("save", "load", "export_checkpoint")},
                                  create_model=_tiny(resmlp.create_model, sizes))
    return {"resmlp": tiny_resmlp, "timm": tiny_timm, "m": m, "p": str(p), "N": n}


def _logits(model, x=X):
    with torch.no_grad():
        return model.eval()(x)


def run_cells(cells, ns, expected, x=X):
    """Evaluate every call of every cell in order; each model returned must compute `expected`."""
    ran = 0
    for cell in cells:
        for code in calls(cell):
            result = eval(code, ns)  # noqa: S307 - the README's own cell, run as printed
            ran += 1
            if isinstance(result, torch.nn.Module):
                torch.testing.assert_close(_logits(result, x), expected, rtol=1e-4, atol=1e-5, msg=code)
    return ran


def test_the_table_has_the_four_rows():
    assert list(table_rows()) == ["this project's model `m`", "timm file", "DeiT file", "DINO checkpoint"]


def test_this_projects_model_into_every_project(tmp_path):
    this, into_timm, into_deit, into_dino = table_rows()["this project's model `m`"]
    full = make_trained_like_(resmlp.create_model("resmlp_s12", num_classes=N))  # timm's resmlp_12_224: full size
    x224 = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    assert run_cells([into_timm], namespace(full, tmp_path / "timm.pth", N), _logits(full, x224), x224) == 2
    m = make_trained_like_(resmlp.create_model("resmlp_s12", num_classes=N, **SMALL))
    expected = _logits(m)
    assert run_cells([this], namespace(m, tmp_path / "m.safetensors", N), expected) == 2
    assert run_cells([into_deit], namespace(m, tmp_path / "deit.pth", N), expected) == 1
    deit = DeitResMLP(num_classes=N)  # DeiT's resmlp_models.resmlp_12 layout, strict as the README says
    deit.load_state_dict(torch.load(tmp_path / "deit.pth", weights_only=True)["model"], strict=True)
    torch.testing.assert_close(_logits(deit), expected, rtol=1e-4, atol=1e-5)
    backbone = make_trained_like_(resmlp.create_model("resmlp_s12", num_classes=0, **SMALL))
    assert run_cells([into_dino], namespace(backbone, tmp_path / "dino.pth", 0), None) == 1
    # DINO's eval_knn.py --checkpoint_key teacher: strip module./backbone., load non-strictly
    state = torch.load(tmp_path / "dino.pth", weights_only=True)["teacher"]
    state = {k.removeprefix("module.").removeprefix("backbone."): v for k, v in state.items()}
    theirs = DeitResMLP(num_classes=0)
    assert not any(theirs.load_state_dict(state, strict=False))
    torch.testing.assert_close(_logits(theirs), _logits(backbone), rtol=1e-4, atol=1e-5)


def test_a_timm_file_into_this_project_and_timm(tmp_path):
    this, into_timm, *_ = table_rows()["timm file"]
    theirs = make_trained_like_(_timm_resmlp())
    theirs.reset_classifier(N)
    make_trained_like_(theirs)
    torch.save({"state_dict": theirs.state_dict()}, tmp_path / "timm.pth")
    ns = namespace(None, tmp_path / "timm.pth", N)
    assert run_cells([this, into_timm], ns, _logits(theirs)) == 3


@pytest.fixture
def published_deit_zoo(tmp_path, monkeypatch):
    """The published DeiT-zoo file in torch.hub's cache, the Hub offline: `pretrained=True` with no network."""
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch"))
    weights = registry.PublishedWeights("http://127.0.0.1:9/resmlp_12_no_dist.pth", hf_hub_id="timm/absent")
    monkeypatch.setitem(registry.PUBLISHED, "resmlp_s12", {"fb_in1k": weights})
    zoo = make_trained_like_(DeitResMLP(), seed=2)
    (tmp_path / "torch" / "checkpoints").mkdir(parents=True)
    torch.save({"model": zoo.state_dict()}, tmp_path / "torch" / "checkpoints" / "resmlp_12_no_dist.pth")
    return zoo


def test_a_deit_file_into_this_project_and_timm(tmp_path, published_deit_zoo):
    this, into_timm, *_ = table_rows()["DeiT file"]
    theirs = make_trained_like_(DeitResMLP(num_classes=N))
    torch.save({"model": theirs.state_dict()}, tmp_path / "deit.pth")
    m = resmlp.create_model("resmlp_s12", num_classes=N, **SMALL)
    ns = namespace(m, tmp_path / "deit.pth", N)
    zoo, expected = _logits(published_deit_zoo), _logits(theirs)
    for cell in (this, into_timm):
        pretrained, *from_file = calls(cell)
        assert "pretrained=True" in pretrained
        run_cells([[pretrained]], ns, zoo)
        assert run_cells([from_file], ns, expected) == len(from_file) >= 1
    torch.testing.assert_close(_logits(m), expected, rtol=1e-4, atol=1e-5)  # load_checkpoint(m, p) filled m


def test_a_dino_checkpoint_into_this_project_and_timm(tmp_path):
    this, into_timm, *_ = table_rows()["DINO checkpoint"]
    teacher = make_trained_like_(DeitResMLP(num_classes=0))
    student = make_trained_like_(DeitResMLP(num_classes=0), seed=1)
    head = {"head.mlp.0.weight": torch.randn(8, 16), "head.last_layer.weight": torch.randn(4, 8)}
    torch.save({"teacher": {**{f"backbone.{k}": v for k, v in teacher.state_dict().items()}, **head},
                "student": {**{f"module.backbone.{k}": v for k, v in student.state_dict().items()},
                            **{f"module.{k}": v for k, v in head.items()}}}, tmp_path / "checkpoint.pth")
    ns = namespace(None, tmp_path / "checkpoint.pth", 0)
    assert run_cells([this], ns, _logits(teacher)) == 1
    assert run_cells([into_timm], ns, _logits(student)) == 1
