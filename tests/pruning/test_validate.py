"""A plan is checked against the model's config before anything else loads: every corruption is named."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from gapprune.pruning.plan import Plan
from gapprune.pruning.validate import check_plan, shapes_from_config
from tests.conftest import tiny_llama
from tests.helpers import tiny_run


@pytest.fixture(scope="module")
def plan_and_shapes():
    """A real plan of the tiny GQA Llama (4 heads in 2 KV groups, 128 channels) at 40%."""
    ids = torch.randint(0, 256, (8, 24), generator=torch.Generator().manual_seed(4))
    model = tiny_llama(0)
    run = tiny_run(model, ids)
    return run.plan(0.4, "gap"), shapes_from_config(model.config)


def corrupted(plan: Plan, change) -> Plan:  # type: ignore[no-untyped-def]
    data = copy.deepcopy(plan.to_dict())
    change(data["layers"])
    return Plan.from_dict(data)


def whole_attention(layer: dict) -> None:
    layer["attn"].update(kept=[0, 1, 2, 3], option=[2, 2])


CORRUPTIONS = {
    # the case that used to pass: a layer keeping all its heads was never sliced, whatever ids it named
    "out of range": lambda ls: (whole_attention(ls[0]), ls[0]["attn"].update(kept=[0, 1, 2, 1_000_000])),
    "listed twice": lambda ls: ls[0]["mlp"].update(kept=[5, 5] + ls[0]["mlp"]["kept"][2:]),
    "must be sorted": lambda ls: ls[0]["mlp"].update(kept=ls[0]["mlp"]["kept"][::-1]),
    "do not fill": lambda ls: ls[1]["attn"].update(kept=[0, 1], option=[2, 1]),  # heads 0 and 1: both group 0
    "option .* says": lambda ls: ls[2]["attn"].update(kept=[0], option=[2, 2]),
    "its option says": lambda ls: ls[2]["mlp"].update(option=[ls[2]["mlp"]["option"][0] + 8]),
    "exceeds the layer": lambda ls: ls[3]["attn"].update(option=[1, 3], kept=[0, 1, 2]),
    "layers must be listed in order": lambda ls: ls.reverse(),
    "has 3 layers, the model 4": lambda ls: ls.pop(),
}


def test_a_plan_written_for_the_model_passes(plan_and_shapes):
    plan, shapes = plan_and_shapes
    check_plan(plan, shapes)
    whole = corrupted(plan, lambda ls: whole_attention(ls[0]))
    check_plan(whole, shapes)  # keeping every head is a valid plan


@pytest.mark.parametrize("problem", sorted(CORRUPTIONS))
def test_each_corruption_is_named_with_its_layer_and_the_fix(plan_and_shapes, problem):
    plan, shapes = plan_and_shapes
    with pytest.raises(ValueError, match=problem) as err:
        check_plan(corrupted(plan, CORRUPTIONS[problem]), shapes)
    assert "plan.json written for this model" in str(err.value)


def test_surgery_refuses_a_plan_that_does_not_fit_instead_of_applying_it(plan_and_shapes):
    from gapprune.models import get_adapter
    from gapprune.pruning import apply_plan_

    plan, _ = plan_and_shapes
    model = tiny_llama(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="out of range"):
        apply_plan_(get_adapter(model), corrupted(plan, CORRUPTIONS["out of range"]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing was cut


def test_the_cli_refuses_a_bad_plan_in_one_line_before_any_weight_loads(plan_and_shapes, tiny_model_folder,
                                                                        tmp_path, capsys, monkeypatch):
    import gapprune.api
    from gapprune.cli import main

    plan, _ = plan_and_shapes
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(corrupted(plan, CORRUPTIONS["out of range"]).to_dict()))

    def no_loading(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the weights were loaded before the plan was checked")

    monkeypatch.setattr(gapprune.api, "load", no_loading)
    folder, _ = tiny_model_folder
    assert main(["prune", str(folder), "--plan", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "id 1000000 is out of range" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
