"""Stages save, load and resume: profile folders, --plan, per-layer checkpoints, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gapprune.cli import main

REPO = Path(__file__).resolve().parents[2]


def prune_args(folder: Path, text: Path, out: Path, *extra: str) -> list[str]:
    return ["prune", str(folder), "--ratio", "0.3", "--out", str(out), "--calib", str(text), "--calib-samples", "4",
            "--profile-samples", "4", "--seq-len", "32", "--batch-size", "2", "--channel-step", "32", "--mlp-stride",
            "1", "--no-plots", *extra]


EXACT = ("--profiler", "exact")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def logits(folder: Path) -> torch.Tensor:
    import gapprune

    model, _ = gapprune.load(str(folder))
    with torch.inference_mode():
        return model(input_ids=torch.arange(40).view(2, 20)).logits


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GAPPRUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_same_command_twice_gives_identical_plan_and_weights(tiny_model_folder, tmp_path, cache):
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "a")) == 0
    assert main(prune_args(folder, text, tmp_path / "b")) == 0
    assert (tmp_path / "a" / "plan.json").read_bytes() == (tmp_path / "b" / "plan.json").read_bytes()
    assert same_weights(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize(("extra", "warned"), [
    (("--compensate", "none"), True),
    (("--compensate", "bias"), True),
    (("--compensate", "none", "--criterion", "activation"), False),
    ((), False),  # the defaults: obs with lsq
])
def test_obs_without_the_lsq_refit_it_assumes_is_flagged(tiny_model_folder, tmp_path, cache, caplog, extra, warned):
    folder, text = tiny_model_folder
    with caplog.at_level("WARNING", logger="gapprune.api"):
        assert main(prune_args(folder, text, tmp_path / "out", *extra)) == 0
    assert any("criterion=activation" in r.getMessage() for r in caplog.records) == warned


def test_a_saved_plan_reproduces_the_pruned_model(tiny_model_folder, tmp_path, cache):
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "first")) == 0
    plan = tmp_path / "first" / "plan.json"
    run = json.loads((tmp_path / "first" / "run.json").read_text())  # what the run took, and where
    assert run["wall_s"] > 0 and {"load", "capture", "profiling", "allocation"} <= set(run["phases"])
    peaks = run["peak_rss_mb_after"]  # which phase set the peak: the running peak after each
    assert set(peaks) == set(run["phases"]) and max(peaks.values()) <= run["peak_rss_mb"]
    assert run["machine"]["cores"] >= 1 and run["throughput"]["dense_forward_tokens_per_s"] > 0
    assert run["command"].split() == ["gapprune", *prune_args(folder, text, tmp_path / "first")]  # not pytest's argv
    without_ratio = [a for a in prune_args(folder, text, tmp_path / "again", "--plan", str(plan)) if a not in ("--ratio", "0.3")]
    assert main(without_ratio) == 0  # the plan carries its ratio
    again = json.loads((tmp_path / "again" / "run.json").read_text())["phases"]
    assert "capture" in again and "importance" not in again  # calibrated to compensate, not scored: the plan names its units
    assert torch.equal(logits(tmp_path / "first"), logits(tmp_path / "again"))
    assert json.loads(plan.read_text())["layers"] == json.loads((tmp_path / "again" / "plan.json").read_text())["layers"]


def test_a_profile_folder_serves_other_ratios_and_allocators(tiny_model_folder, tmp_path, cache):
    folder, text = tiny_model_folder
    profile_args = ["profile", str(folder), "--out", str(tmp_path / "profile"), "--calib", str(text), "--calib-samples",
                    "4", "--profile-samples", "4", "--seq-len", "32", "--batch-size", "2", "--channel-step", "32",
                    "--mlp-stride", "1"]
    assert main(profile_args) == 0
    direct = tmp_path / "direct"
    assert main(prune_args(folder, text, direct, "--ratio", "0.4")) == 0
    reused = tmp_path / "reused"
    assert main(prune_args(folder, text, reused, "--ratio", "0.4", "--profile", str(tmp_path / "profile"))) == 0
    assert (direct / "plan.json").read_bytes() == (reused / "plan.json").read_bytes()
    phases = {d.name: json.loads((d / "run.json").read_text())["phases"] for d in (direct, reused)}
    assert "importance" in phases["direct"] and "importance" not in phases["reused"]  # this run's work only
    assert main(prune_args(folder, text, tmp_path / "owl", "--allocator", "owl", "--profile", str(direct))) == 0
    owl = json.loads((tmp_path / "owl" / "plan.json").read_text())
    assert owl["config"]["allocator"] == "owl" and owl["layers"] != json.loads((direct / "plan.json").read_text())["layers"]
    assert "importance" not in json.loads((tmp_path / "owl" / "run.json").read_text())["phases"]


def test_a_baseline_that_never_measured_dl_predicts_none_and_says_so(tiny_model_folder, tmp_path, cache, capsys):
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "owl", "--allocator", "owl")) == 0
    summary = json.loads((tmp_path / "owl" / "plan.json").read_text())["summary"]
    printed = capsys.readouterr().out
    assert summary["predicted_loss"] is None and summary["plan_check"]["predicted"] is None  # not a sum of zeros
    assert "not predicted (owl does not read it), measured" in printed
    assert "none (allocator `owl` does not read ΔL)" in (tmp_path / "owl" / "report.md").read_text()
    assert main(prune_args(folder, text, tmp_path / "gap")) == 0  # a measured table: its sum is the prediction
    assert json.loads((tmp_path / "gap" / "plan.json").read_text())["summary"]["predicted_loss"] > 0
    assert "ΔL (kl) predicted " in capsys.readouterr().out


def test_a_decoder_ratio_prunes_that_share_of_the_decoder_also_from_an_older_profile(tiny_model_folder, tmp_path,
                                                                                   cache):
    folder, text = tiny_model_folder
    out = tmp_path / "half"
    assert main(prune_args(folder, text, out, "--ratio", "0.5", "--ratio-of", "decoder")) == 0
    summary = json.loads((out / "plan.json").read_text())["summary"]
    assert 0.5 <= summary["decoder_ratio"] < 0.55 and summary["achieved_ratio"] < 0.5
    assert "of the decoder)" in (out / "report.md").read_text()
    meta = json.loads((out / "profile.json").read_text())
    del meta["decoder_params"]  # as a profile saved before decoder parameters were counted
    (out / "profile.json").write_text(json.dumps(meta))
    again = tmp_path / "again"
    assert main(prune_args(folder, text, again, "--ratio", "0.5", "--ratio-of", "decoder", "--profile", str(out))) == 0
    assert json.loads((again / "plan.json").read_text())["layers"] == json.loads((out / "plan.json").read_text())["layers"]


def test_a_profile_of_other_settings_is_refused(tiny_model_folder, tmp_path, cache, capsys):
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "a")) == 0
    code = main(prune_args(folder, text, tmp_path / "b", "--criterion", "magnitude", "--profile", str(tmp_path / "a")))
    assert code == 2 and "settings differ: criterion" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


KILL_AFTER_LAYERS = """
import os, signal, sys
from gapprune.profiling.checkpoint import LayerCheckpoint
from gapprune.cli import main
saved = LayerCheckpoint.save
count = [0]
def save_then_die(self, layer, row):
    saved(self, layer, row)
    count[0] += 1
    if count[0] == int(os.environ["KILL_AFTER"]):
        os.kill(os.getpid(), signal.SIGKILL)
LayerCheckpoint.save = save_then_die
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_profile_resumes_and_ends_with_the_same_plan(tiny_model_folder, tmp_path, cache):
    """The exact table checkpoints each layer (the auto profiler's screen and rounds are minutes, not hours)."""
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "whole", *EXACT)) == 0
    killed = tmp_path / "killed"
    env = {**os.environ, "KILL_AFTER": "2", "GAPPRUNE_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", KILL_AFTER_LAYERS, *prune_args(folder, text, killed, *EXACT)], env=env,
                         capture_output=True, text=True, check=False)
    assert run.returncode == -9, run.stderr[-2000:]
    assert not killed.exists()  # no half-written output folder
    rows = list(cache.glob("tables/*/layer_*.json"))
    assert len(rows) == 2  # two of four layers were measured before the kill
    assert main(prune_args(folder, text, killed, *EXACT)) == 0
    table = json.loads((killed / "loss_table.json").read_text())
    assert table["meta"]["resumed_layers"] == sorted(int(p.stem.split("_")[1]) for p in rows)
    assert (killed / "plan.json").read_bytes() == (tmp_path / "whole" / "plan.json").read_bytes()
    assert not list(cache.glob("tables/*/layer_*.json"))  # a finished table leaves no checkpoint behind


KILL_AFTER_ROUNDS = """
import os, signal, sys
from gapprune.profiling.checkpoint import EntryCheckpoint
from gapprune.cli import main
saved = EntryCheckpoint.save_round
def save_then_die(self, values):
    saved(self, values)
    os.kill(os.getpid(), signal.SIGKILL)
EntryCheckpoint.save_round = save_then_die
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_auto_run_resumes_from_its_rounds_and_ends_with_the_same_plan(tiny_model_folder, tmp_path, cache):
    """The auto profiler keeps its screen and every round's exact entries; a rerun replays none of them."""
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "whole")) == 0
    assert not list(cache.glob("tables/*/*.json"))  # a finished run leaves no checkpoint behind
    killed = tmp_path / "killed"
    env = {**os.environ, "GAPPRUNE_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", KILL_AFTER_ROUNDS, *prune_args(folder, text, killed)], env=env,
                         capture_output=True, text=True, check=False)
    assert run.returncode == -9, run.stderr[-2000:]
    assert not killed.exists()
    assert len(list(cache.glob("tables/*/screen.json"))) == 1 and len(list(cache.glob("tables/*/round_*.json"))) == 1
    assert main(prune_args(folder, text, killed)) == 0
    whole, resumed = (json.loads((d / "plan.json").read_text()) for d in (tmp_path / "whole", killed))
    assert resumed["layers"] == whole["layers"]
    assert json.loads((killed / "loss_table.json").read_text())["loss"] == \
        json.loads((tmp_path / "whole" / "loss_table.json").read_text())["loss"]
    assert not list(cache.glob("tables/*/*.json"))


def test_a_profile_lends_its_scores_to_the_same_model_and_refuses_other_weights():
    """Scores reused from a profile skip scoring (obs on a 1.5B model is minutes) and give the same plan;
    the same shape with other weights is caught by its freshly measured layer signals."""
    from gapprune.pipeline import calibrate_on, plan_for
    from tests.conftest import tiny_llama
    from tests.helpers import tiny_config, tiny_run

    ids = torch.randint(0, 256, (8, 24), generator=torch.Generator().manual_seed(3))
    model = tiny_llama(0)
    run = tiny_run(model, ids, criterion="obs")
    profile, config = run.profile, tiny_config(ids, criterion="obs")
    again = calibrate_on(model, ids, config, scores=profile.scores)
    assert "importance" not in again.timings and again.scores is profile.scores
    assert calibrate_on(model, ids, config).scores.to_dict() == profile.scores.to_dict()  # what scoring would give
    assert plan_for(config, again, profile)[0].layers == plan_for(config, None, profile, adapter=again.adapter)[0].layers
    other = calibrate_on(tiny_llama(1), ids, config, scores=profile.scores)
    with pytest.raises(ValueError, match="other weights"):
        plan_for(config, other, profile)
    half = calibrate_on(tiny_llama(0).to(torch.bfloat16), ids, config, scores=profile.scores)  # a GPU's `auto` dtype
    with pytest.raises(ValueError, match="measured on float32 weights and this run's are bfloat16"):
        plan_for(config, half, profile)
    del profile.settings["weights_dtype"]  # as profiles saved before the dtype was recorded
    with pytest.raises(ValueError, match="saved before gapprune recorded the weights' dtype"):
        plan_for(config, half, profile)


def test_one_budget_value_reaches_plan_for_and_a_parameter_count_is_the_ratio_it_equals():
    """How much goes is one `Budget`: a parameter count plans exactly as the ratio that gives that count,
    the plan records the budget, and a runtime budget without its cost table or with a baseline is refused."""
    from gapprune.budget import ParamsBudget, RatioBudget, SpeedupBudget
    from gapprune.pipeline import plan_for
    from tests.conftest import tiny_llama
    from tests.helpers import tiny_config, tiny_run

    ids = torch.randint(0, 256, (8, 24), generator=torch.Generator().manual_seed(4))
    run = tiny_run(tiny_llama(0), ids)
    config = tiny_config(ids)
    by_ratio, _ = plan_for(config, None, run.profile, adapter=run.adapter, budget=RatioBudget(0.4))
    count = ParamsBudget(run.profile.budget(0.4))
    by_count, _ = plan_for(config, None, run.profile, adapter=run.adapter, budget=count)
    assert by_count.layers == by_ratio.layers != run.plan(config.ratio, config.allocator).layers
    assert by_count.summary["budget"] == count.to_record() and by_count.config["ratio"] is None
    assert by_ratio.config["ratio"] == 0.4 and by_ratio.summary["chosen_exact"]["exact"] == \
        by_ratio.summary["chosen_exact"]["chosen"]  # an exact table: every pick is exact
    with pytest.raises(ValueError, match="cost table"):
        plan_for(config, None, run.profile, adapter=run.adapter, budget=SpeedupBudget(1.5))
    with pytest.raises(ValueError, match="gap allocator"):
        plan_for(config, None, run.profile, adapter=run.adapter, budget=SpeedupBudget(1.5), allocator="uniform")


def test_a_plan_names_the_layers_it_empties_and_warns_when_it_empties_them_all(caplog):
    from tests.conftest import tiny_llama
    from tests.helpers import tiny_run

    ids = torch.randint(0, 256, (8, 24), generator=torch.Generator().manual_seed(5))
    run = tiny_run(tiny_llama(0), ids)
    assert run.plan(0.3, "gap").summary["emptied_layers"] == []
    with caplog.at_level("WARNING", logger="gapprune.pipeline"):
        everything = run.plan(0.999, "gap", ratio_of="decoder")
    assert everything.summary["emptied_layers"] == list(range(len(everything.layers)))
    assert "empties every decoder layer" in caplog.text


def test_a_prune_reports_its_predicted_loss_beside_the_measured_one_on_held_out_windows(tiny_model_folder, tmp_path):
    folder, text = tiny_model_folder
    out = tmp_path / "checked"
    assert main(prune_args(folder, text, out, "--compensate", "lsq", *EXACT)) == 0
    check = json.loads((out / "plan.json").read_text())["summary"]["plan_check"]
    assert check["windows"] == 8 and check["seq_len"] == 32 and check["metric"] == "kl"
    assert check["measured_masked"] > 0 and check["predicted"] > 0
    assert check["measured_saved"] != check["measured_masked"]  # lsq changed the saved model
    assert "held-out calibration windows" in (out / "report.md").read_text()
    assert "plan_check" in json.loads((out / "run.json").read_text())["phases"]
    skipped = tmp_path / "unchecked"
    assert main(prune_args(folder, text, skipped, "--check-samples", "0")) == 0
    assert "plan_check" not in json.loads((skipped / "plan.json").read_text())["summary"]


def test_the_printed_summary_and_plan_count_the_biases_lsq_adds(tiny_model_folder, tmp_path, cache, capsys):
    import gapprune

    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "out", *EXACT)) == 0
    summary = json.loads((tmp_path / "out" / "plan.json").read_text())["summary"]
    model, _ = gapprune.load(str(tmp_path / "out"))
    saved = sum(p.numel() for p in model.parameters())
    assert saved == summary["params_after_with_added_biases"] > summary["params_after"]
    assert summary["achieved_ratio_with_added_biases"] == round(1 - saved / summary["params_before"], 6)
    printed = capsys.readouterr().out
    assert (f"the saved model holds {saved:,} parameters: {saved - summary['params_after']:,} output-projection "
            f"biases added by lsq are not in the removed share") in printed
