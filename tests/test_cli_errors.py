"""Bad input and interruptions at the command line: one line naming the problem and the fix, exit code 2
(130 when stopped), before any work, and no partial output left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from gapprune.cli import main, stop_on_sigterm
from gapprune.export.save import write_atomically

UNWRITABLE = Path("/proc/gapprune-test")  # /proc refuses new entries, even to root
needs_proc = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")


def prune_args(folder: Path, text: Path, out: Path, *extra: str) -> list[str]:
    return ["prune", str(folder), "--ratio", "0.3", "--out", str(out), "--calib", str(text), "--calib-samples", "4",
            "--profile-samples", "4", "--seq-len", "32", "--channel-step", "32", "--no-plots", *extra]


@pytest.mark.parametrize(("device", "message"), [
    pytest.param("cuda", "no CUDA GPU here", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has CUDA")),
    pytest.param("cuda:64", "CUDA GPU", id="cuda-index"),
    ("garbage", "not a device name"),
])
@pytest.mark.parametrize("command", ["prune", "ppl", "tune"])
def test_a_device_that_is_not_there_is_refused_before_loading(tiny_model_folder, tmp_path, capsys, monkeypatch,
                                                             device, message, command):
    import gapprune.api

    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the device was checked"))
    folder, text = tiny_model_folder
    argv = {"prune": prune_args(folder, text, tmp_path / "out"), "ppl": ["ppl", str(folder)],
            "tune": ["tune", str(folder), "--out", str(tmp_path / "out"), "--distill"]}[command]
    assert main([*argv, "--device", device]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_output_that_is_a_file_or_lies_under_one_is_refused_before_loading(tiny_model_folder, tmp_path, capsys):
    folder, text = tiny_model_folder
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    assert main(prune_args(folder, text, a_file, "--overwrite")) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and a_file.read_text() == "keep me"
    assert main(prune_args(folder, text, a_file / "out")) == 2
    assert "is a file, so" in capsys.readouterr().err


@needs_proc
@pytest.mark.parametrize("where", ["out", "gguf"])
def test_an_unwritable_output_is_refused_before_any_work(tiny_model_folder, tmp_path, capsys, monkeypatch, where):
    import gapprune.api

    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the output was checked"))
    folder, text = tiny_model_folder
    out, extra = (UNWRITABLE / "out", []) if where == "out" else (tmp_path / "out", ["--gguf", str(UNWRITABLE / "m.gguf")])
    assert main(prune_args(folder, text, out, *extra)) == 2
    assert "cannot write" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_sigterm_unwinds_like_ctrl_c_and_leaves_no_temporary_folder(tmp_path):
    def fill(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"x")
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), stop_on_sigterm():
        write_atomically(tmp_path / "out", fill)
    assert not list(tmp_path.iterdir())
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the command's only


def test_a_stopped_command_exits_130_with_one_line(tiny_model_folder, tmp_path, capsys, monkeypatch):
    from gapprune.cli.prune import PruneCommand

    def killed(args):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(PruneCommand, "run", staticmethod(killed))
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "out")) == 130
    assert "stopped by SIGTERM; no partial output" in capsys.readouterr().err


def test_a_speed_budget_on_a_folder_names_the_export_before_any_work(tiny_model_folder, tmp_path, capsys):
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "out", "--speedup", "1.5")) == 2
    err = capsys.readouterr().err
    assert "--speedup times llama.cpp" in err and f"gapprune export {folder} --gguf" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("config", "message"), [
    (None, "is not a model folder (no config.json)"),
    ('{"model_type": "zzgarbage"}', "names no model family this transformers knows"),
    ("{}", "names no model family this transformers knows"),
])
def test_a_folder_without_a_known_config_says_so_in_one_line(tmp_path, capsys, config, message):
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    assert main(["info", str(folder)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert config is None or "gapprune prunes" in err and "LlamaForCausalLM" in err


@pytest.mark.parametrize("command", [["info"], ["export", "--gguf", "OUT"]])
def test_a_family_gapprune_does_not_prune_is_refused_by_info_and_export_before_loading(tmp_path, capsys, command):
    from transformers import BertConfig

    folder = tmp_path / "bert"
    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
               vocab_size=100).save_pretrained(folder)  # no weights: refused from config.json alone
    argv = [command[0], str(folder), *[str(tmp_path / "b.gguf") if a == "OUT" else a for a in command[1:]]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture" in err and "LlamaForCausalLM" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["ppl"], ["eval", "--ppl", "wikitext2"], ["bench"]])
@pytest.mark.parametrize(("family", "message"), [
    ("bert", "holds a BertModel, not a causal language model"),
    ("t5", "model_type 't5' has no causal language model"),
])
def test_a_model_that_is_not_a_causal_lm_is_refused_by_the_measuring_commands_before_loading(
        tmp_path, capsys, monkeypatch, command, family, message):
    import transformers
    from transformers import BertConfig, T5Config

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("weights loaded before the family was checked"))
    folder = tmp_path / family
    config = (BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                         vocab_size=100, architectures=["BertModel"]) if family == "bert" else
              T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=64, vocab_size=100))
    config.save_pretrained(folder)
    assert main([command[0], str(folder), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_ratio_of_the_model_beyond_its_decoder_is_refused_before_calibration(tiny_model_folder, tmp_path, capsys,
                                                                               monkeypatch):
    import gapprune.api

    monkeypatch.setattr(gapprune.api, "calibrate", lambda *a, **k: pytest.fail("calibrated an unreachable ratio"))
    folder, text = tiny_model_folder
    argv = prune_args(folder, text, tmp_path / "out")
    argv[argv.index("--ratio") + 1] = "0.99"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "only the decoder layers can be pruned" in err and "--ratio-of decoder" in err
    assert not (tmp_path / "out").exists()


def test_an_unknown_zero_shot_task_is_named_before_the_model_loads(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "no-model-here"), "--ppl", "", "--tasks", "piqa,foobar"]) == 2
    assert "unknown task 'foobar'; choose from boolq" in capsys.readouterr().err


def test_a_plan_file_that_is_not_there_is_named(tmp_path, capsys):
    assert main(["prune", "smollm2-135m", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist; pass the plan.json an earlier prune wrote" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--calib", "{tmp}/missing.txt"], "text file {tmp}/missing.txt does not exist"),
    (["--eval", "wikitext2,{tmp}/missing.jsonl"], "text file {tmp}/missing.jsonl does not exist"),
    (["--calib", "wikitext2", "--calib-split", "train"], "has splits test, validation, not 'train'"),
    (["--eval", "wikitext3"], "unknown data set 'wikitext3'"),
], ids=["calib-file", "eval-file", "calib-split", "eval-name"])
def test_a_text_that_cannot_be_read_is_refused_before_prune_loads_the_model(tiny_model_folder, tmp_path, capsys,
                                                                          monkeypatch, argv, message):
    import gapprune.api

    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the text was checked"))
    folder, text = tiny_model_folder
    argv = [a.format(tmp=tmp_path) for a in argv]
    if argv[0] == "--calib":  # replaces prune_args' own --calib
        base = prune_args(folder, text, tmp_path / "out")
        base[base.index("--calib") + 1] = argv[1]
        argv = base + argv[2:]
    else:
        argv = prune_args(folder, text, tmp_path / "out", *argv)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["ppl", "{model}", "--dataset", "{tmp}/missing.txt"],
                                  ["ppl", "{model}", "--dataset", "ptb", "--split", "train"],
                                  ["eval", "{model}", "--ppl", "wikitext2,{tmp}/missing.txt"],
                                  ["profile", "{model}", "--out", "{tmp}/p", "--calib", "{tmp}/missing.txt"]],
                         ids=["ppl-file", "ppl-split", "eval-file", "profile-calib"])
def test_the_measuring_commands_check_their_text_before_loading(tiny_model_folder, tmp_path, capsys, monkeypatch,
                                                                argv):
    import gapprune.api

    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the text was checked"))
    folder, _ = tiny_model_folder
    assert main([a.format(model=folder, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert ("does not exist" in err or "has splits" in err) and len(err.strip().splitlines()) == 1


def test_profile_does_not_offer_a_compensation_aware_table_it_cannot_measure(tiny_model_folder, tmp_path, capsys):
    """A profile is measured uncompensated (its `compensate` is none), so `--compensation-aware`, which needs a
    compensation, would always fail its config check; the flag is `prune`'s alone."""
    folder, text = tiny_model_folder
    with pytest.raises(SystemExit) as stopped:
        main(["profile", str(folder), "--out", str(tmp_path / "p"), "--calib", str(text), "--compensation-aware"])
    assert stopped.value.code == 2 and "unrecognized arguments: --compensation-aware" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_a_profile_of_other_settings_is_refused_before_the_model_loads(tiny_model_folder, tmp_path, capsys,
                                                                       monkeypatch):
    import gapprune.api

    folder, text = tiny_model_folder
    assert main(["profile", str(folder), "--out", str(tmp_path / "profile"), "--calib", str(text), "--calib-samples",
                 "4", "--profile-samples", "4", "--seq-len", "32", "--channel-step", "32"]) == 0
    capsys.readouterr()  # the profile's own progress
    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the profile was checked"))
    argv = prune_args(folder, text, tmp_path / "out", "--profile", str(tmp_path / "profile"))
    argv[argv.index("--seq-len") + 1] = "24"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "settings differ: seq_len" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--distill", "--data", "c4+{tmp}/missing.txt"], "training text '{tmp}/missing.txt' is neither"),
    (["--distill", "--val-data", "{tmp}/missing.txt"], "training text '{tmp}/missing.txt' is neither"),
    (["--distill", "--data", "ptb"], "'ptb' is an evaluation set"),
    (["--data", "{tmp}/missing.json"], "instruction data {tmp}/missing.json does not exist"),
], ids=["distill-data", "distill-val-data", "distill-evaluation-set", "lora-data"])
def test_tuning_text_that_cannot_be_read_is_refused_before_loading(tiny_model_folder, tmp_path, capsys, monkeypatch,
                                                                   extra, message):
    import gapprune.api

    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the text was checked"))
    folder, _ = tiny_model_folder
    argv = ["tune", str(folder), "--out", str(tmp_path / "out"), *(a.format(tmp=tmp_path) for a in extra)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
