from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gapprune.cli import build_parser, main
from gapprune.config import PruneConfig


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.1, 1.5])
def test_ratio_outside_open_unit_interval_is_rejected(ratio):
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        PruneConfig(ratio=ratio)


def test_prune_flags_come_from_the_config_dataclass():
    args = build_parser().parse_args(["prune", "m", "--ratio", "0.3", "--out", "o", "--criterion", "taylor"])
    assert args.ratio == 0.3 and args.criterion == "taylor" and args.allocator == "gap" and args.profile_samples == 8


def test_cli_reports_bad_input_without_a_traceback(capsys, tmp_path):
    code = main(["prune", str(tmp_path / "missing.gguf"), "--ratio", "0.2", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_profiler_and_ridge_flags_are_validated():
    args = build_parser().parse_args(["prune", "m", "--ratio", "0.3", "--out", "o", "--profiler", "fisher", "--ridge", "1"])
    assert args.profiler == "fisher" and args.ridge == 1.0
    with pytest.raises(ValueError, match="profiler must be auto, exact or fisher"):
        PruneConfig(ratio=0.3, profiler="hessian")
    with pytest.raises(ValueError, match="ridge must be >= 0"):
        PruneConfig(ratio=0.3, ridge=-1)
    with pytest.raises(ValueError, match="ratio_of must be model or decoder"):
        PruneConfig(ratio=0.3, ratio_of="embedding")
    assert build_parser().parse_args(["prune", "m", "--ratio", "0.5", "--out", "o", "--ratio-of", "decoder"]).ratio_of == "decoder"


def test_every_command_prints_its_help(capsys):
    # a help text with a bare "%" (e.g. "9-13% faster") once made `gapprune prune --help` raise a TypeError
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"prune", "tune", "eval"} <= set(commands)
    for name in commands:
        with pytest.raises(SystemExit) as ended:
            parser.parse_args([name, "--help"])
        assert ended.value.code == 0, name
        assert f"usage: gapprune {name}" in capsys.readouterr().out


def test_tune_help_gives_each_method_its_own_meaning_of_a_shared_flag():
    """`--data` means Alpaca-format files to LoRA and web text or a mix to distillation; `--lr` 0 stands
    for distillation's default, which the help must spell out rather than print 0."""
    tune = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["tune"]
    helps = {a.dest: a.help for a in tune._actions}
    assert "c4" in helps["data"] and "joined by +" in helps["data"] and "Alpaca-format" in helps["data"]
    assert "distill default: 1e-4" in helps["lr"] and "distill default: 0.0" not in helps["lr"]


def test_the_command_line_parses_without_loading_torch_or_transformers():
    """`gapprune --help` took 7 s loading torch and transformers it never used; parsing alone now loads neither,
    and the package's names still resolve on first use."""
    loaded = "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    help_run = ("import sys, runpy\nsys.argv = ['gapprune', 'tune', '--help']\ntry:\n"
                "    runpy.run_module('gapprune', run_name='__main__')\nexcept SystemExit:\n    pass\n" + loaded)
    parse = "import sys\nfrom gapprune.cli import build_parser\nbuild_parser().parse_args(['prune', 'm', '--ratio', '0.3', " \
            "'--out', 'o'])\n" + loaded
    for script in (help_run, parse):
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
        assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout[-300:] + run.stderr[-300:]
    import gapprune.pruning.plan  # the subpackage whose code the function runs, imported first
    import gapprune.tune
    import gapprune.tune.distillation  # the module whose code the function runs, imported first
    from gapprune.tune import distill

    assert callable(gapprune.prune) and callable(gapprune.load) and gapprune.Plan is sys.modules["gapprune.pruning.plan"].Plan
    assert callable(distill) and callable(gapprune.tune.distill) and gapprune.tune.TuneConfig().rank == 8
    with pytest.raises(AttributeError, match="no attribute 'loads'"):
        gapprune.loads  # noqa: B018
