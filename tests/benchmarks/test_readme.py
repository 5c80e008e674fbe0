"""The README's numbers are rendered from docs/results/*.json, and its prose restates none."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.scripts import benchmark_script

readme = benchmark_script("readme")

README = readme.ROOT / "README.md"
# a measured-looking number standing alone (model names such as Qwen2.5 or SmolLM2-135M are not numbers)
MEASURED = re.compile(r"(?<![\w.-])(\d+\.\d+|\d+ ?%|\d+ ?(min|s|ms|MB|GB|×|x)\b)")


def prose(text: str) -> str:
    """The README without its rendered blocks, code blocks, inline code and image lines."""
    text = readme.BLOCK.sub("", text)
    lines = [line for line in text.splitlines() if not line.startswith("    ") and not line.startswith("![")]
    return re.sub(r"`[^`]*`", "", "\n".join(lines))


def test_readme_rendered_parts_are_what_the_records_render_now():
    texts = {path: path.read_text() for path in readme.RENDERED_FILES}
    assert set(readme.BLOCKS) <= {m["name"] for text in texts.values() for m in readme.BLOCK.finditer(text)}
    records = readme.load_records()
    for path, text in texts.items():
        assert readme.render(text, records) == text, f"stale {path.name}: run python benchmarks/readme.py"


def test_readme_prose_restates_no_measured_number_and_stays_short():
    text = README.read_text()
    assert len(text.splitlines()) <= 130
    found = [m.group(0) for m in MEASURED.finditer(prose(text))]
    assert not found, f"numbers outside the rendered blocks: {found}"


def row(model: str, allocator: str, compensate: str, dataset: str, ppl: float, **extra: object) -> dict:
    return {"kind": "ppl", "model": model, "allocator": allocator, "compensate": compensate, "dataset": dataset,
            "ppl": ppl, "target_ratio": 0.0 if allocator == "dense" else 0.25, "ratio_of": "model", "windows": 256,
            "criterion": "obs", "profiler": "auto", **extra}


def test_the_subset_table_takes_the_latest_record_of_the_default_calibration_and_the_best_baseline():
    records = [row("smollm2-135m", "dense", "none", d, 50.0) for d in ("wikitext2", "ptb")]
    for dataset, gap, owl, depth in (("wikitext2", 90.0, 110.0, 120.0), ("ptb", 170.0, 260.0, 240.0)):
        records += [row("smollm2-135m", "gap", "lsq", dataset, gap + 5), row("smollm2-135m", "gap", "lsq", dataset, gap),
                    row("smollm2-135m", "owl", "lsq", dataset, owl), row("smollm2-135m", "depth", "lsq", dataset, depth),
                    row("smollm2-135m", "gap", "lsq", dataset, 1.0, calibration="c4"),  # another calibration
                    row("smollm2-135m", "gap", "lsq", dataset, 2.0, calib="wikitext2+ptb")]
    table = readme.subsets({"allocators": records})
    assert "| wikitext2 | **90.0* / 170.0 / —** | 110.0* / 260.0 / — (owl) | 18% / 35% / — |" in table
    assert "| c4 |" not in table  # the C4-calibrated GAP has no baseline to stand beside
    with pytest.raises(LookupError, match="no record of"):
        readme.main_job({"main_job": []})


def test_an_unknown_block_is_an_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="has no renderer"):
        readme.render("<!-- rendered:nonsense -->\n<!-- /rendered -->", {})


def whole(model: str, allocator: str, dataset: str, ppl: float, date: str = "2026-12-07", seq_len: int = 128,
          **extra: object) -> dict:
    return {"kind": "protocol", "model": model, "allocator": allocator, "dataset": dataset, "seq_len": seq_len,
            "ppl": ppl, "date": date, "target_ratio": 0.0 if allocator == "dense" else 0.25, "ratio_of": "model",
            "calibration": None if allocator == "dense" else "wikitext2", **extra}


def test_the_protocol_table_shows_plans_of_todays_defaults_and_the_best_baseline_only():
    records = [whole("smollm2-135m", "dense", "wikitext2", 56.0, date="2026-11-01"),
               whole("smollm2-135m", "gap", "wikitext2", 90.0, date="2026-12-04"),  # an older plan: not shown
               whole("smollm2-135m", "owl", "wikitext2", 120.0), whole("smollm2-135m", "depth", "wikitext2", 110.0),
               whole("smollm2-135m", "gap", "wikitext2", 1.0, calibration="c4")]  # not the default calibration
    records += [{"kind": "protocol_zeroshot", "model": "smollm2-135m", "method": "dense", "ratio": 0.0, "task": task,
                 "value": value, "limit": None, "date": "2026-11-01"}
                for task, value in zip(readme.ZERO_SHOT, (0.1, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4))]
    table = readme.results({"protocols": records})
    assert "| smollm2-135m | — | dense | 56.0 | — | — | 35.7 | 40.0 |" in table
    assert "| smollm2-135m | 25% of the model | depth, best baseline | 110.0 | — | — | — | — |" in table
    assert "owl" not in table and "1.0 |" not in table
    # no plan of today's defaults yet: the earlier plan's record, labelled with its date
    assert "| gap (plans of 2026-12-04, earlier defaults) | **90.0** |" in table  # beats depth's 110.0
    records.append(whole("smollm2-135m", "gap", "wikitext2", 100.0))
    table = readme.results({"protocols": records})
    assert "| smollm2-135m | 25% of the model | gap | **100.0** | — | — | — | — |" in table and "90.0" not in table


def test_bold_marks_the_better_of_gap_and_the_best_baseline_per_column_and_nothing_unopposed():
    gap, baseline = [100.0, 200.0, None, 40.0, None], [110.0, 150.0, 50.0, 41.0, 30.0]
    assert readme.better_cells(gap, baseline) == ([True, False, False, False, False],
                                                   [False, True, False, True, False])
    records = [whole("smollm2-135m", "gap", "wikitext2", 100.0), whole("smollm2-135m", "gap", "ptb", 200.0),
               whole("smollm2-135m", "owl", "wikitext2", 110.0), whole("smollm2-135m", "owl", "ptb", 150.0)]
    table = readme.results({"protocols": records})
    assert "| gap | **100.0** | 200.0 | — | — | — |" in table
    assert "| owl, best baseline | 110.0 | **150.0** | — | — | — |" in table


def test_a_code_model_row_takes_its_code_calibrated_plan():
    records = [whole("qwen2.5-coder-1.5b", "gap", "wikitext2", 40.0, ratio_of="decoder"),
               whole("qwen2.5-coder-1.5b", "gap", "wikitext2", 45.0, ratio_of="decoder", calibration="code")]
    assert "| qwen2.5-coder-1.5b | 25% of the decoder | gap | 45.0 |" in readme.results({"protocols": records})


def test_the_instruction_sentence_sets_each_calibration_beside_dense_on_both_texts():
    def skill(method: str, calibration: str | None, dataset: str, ppl: float) -> dict:
        return {"kind": "skill_ppl", "model": "smollm2-135m", "method": method, "calibration": calibration,
                "ratio": 0.0 if method == "dense" else 0.25, "dataset": dataset, "ppl": ppl}

    records = [skill("dense", None, "alpaca", 5.0), skill("dense", None, "wikitext2", 50.0),
               skill("gap", "wikitext2", "alpaca", 9.0), skill("gap", "wikitext2", "wikitext2", 90.0),
               skill("gap", "alpaca", "alpaca", 7.0), skill("gap", "alpaca", "alpaca", 6.0),  # the later one counts
               skill("gap", "alpaca", "wikitext2", 120.0)]
    sentence = readme.instructions({"skills": records})
    assert "at 25%, calibrated on alpaca / wikitext2" in sentence
    assert "on held-out Alpaca instructions 6.0 / 9.0 against dense 5.0" in sentence
    assert "on WikiText-2 (first 256 windows) 120.0 / 90.0 against dense 50.0" in sentence
    assert readme.instructions({"skills": records[:2]}) == ""  # no pruned model measured: nothing said


def test_a_code_model_row_is_set_beside_its_prose_calibrated_prune_when_one_is_measured():
    code = [whole("qwen2.5-coder-1.5b", "gap", "wikitext2", 88.0, ratio_of="decoder", calibration="code")]
    assert "calibrated on WikiText-2 instead" not in readme.results({"protocols": code})
    prose = [whole("qwen2.5-coder-1.5b", "gap", "wikitext2", 39.0, ratio_of="decoder", date="2026-12-05"),
             whole("qwen2.5-coder-1.5b", "gap", "ptb", 72.0, ratio_of="decoder", date="2026-12-05"),
             whole("smollm2-135m", "gap", "wikitext2", 90.0)]  # a prose model's own calibration: no such sentence
    text = readme.results({"protocols": code + prose})
    assert ("The same qwen2.5-coder-1.5b prune at 25% of the decoder calibrated on WikiText-2 instead (plan of "
            "2026-12-05) reads 39.0 / 72.0: keeping code costs prose") in text
    assert text.count("calibrated on WikiText-2 instead") == 1


def test_the_skill_line_shows_the_default_calibration_first_and_others_after_it():
    def humaneval(method: str, calibration: str | None, passed: int) -> dict:
        return {"kind": "skill", "model": "qwen2.5-coder-1.5b", "method": method, "calibration": calibration,
                "ratio": 0.25, "ratio_of": "decoder", "task": "humaneval", "passed": passed, "n": 164,
                "value": passed / 164}

    records = {"skills": [humaneval("dense", None, 87), humaneval("gap", "code (the default ...)", 51),
                          humaneval("gap", "wikitext2", 2), humaneval("gap", "code+wikitext2", 40),
                          {"kind": "skill_ppl", "model": "qwen2.5-coder-1.5b", "method": "dense", "calibration": None,
                           "dataset": "wikitext2", "ppl": 9.0}]}  # another model's perplexity: not an instruction line
    line = readme.skills(records)
    assert "calibrated on code: HumanEval pass@1 51/164 (31.1%) against the dense model's 87/164" in line
    assert line.index("51/164") < line.index("; calibrated on code+wikitext2: 40/164; calibrated on wikitext2: 2/164.")
    assert "instruction" not in line
    with pytest.raises(KeyError, match="default calibration"):
        readme.skills({"skills": [r for r in records["skills"] if not str(r["calibration"]).startswith("code ")]})


def test_a_skill_record_pruned_with_more_options_is_shown_beside_the_default_not_instead_of_it():
    def humaneval(method: str, passed: int, options: list[str] | None = None) -> dict:
        record = {"kind": "skill", "model": "qwen2.5-coder-1.5b", "method": method,
                  "calibration": None if method == "dense" else "code", "ratio": 0.25, "ratio_of": "decoder",
                  "task": "humaneval", "passed": passed, "n": 164, "value": passed / 164}
        return record | ({"prune_options": options} if options is not None else {})

    line = readme.skills({"skills": [humaneval("dense", 87), humaneval("gap", 51, []),
                                     humaneval("gap", 55, ["--calib-samples", "128"])]})
    assert "calibrated on code: HumanEval pass@1 51/164 (31.1%)" in line
    assert "; calibrated on code with `--calib-samples 128`: 55/164." in line


def test_the_test_line_names_the_ci_machine_only_when_it_is_not_the_main_jobs():
    job = {"kind": "main_job", "job": readme.MAIN_JOB, "machine": {"processor": "Intel Xeon", "cores": 2}}
    ci = {"kind": "ci", "date": "2026-12-08", "code": "abc1234", "wall_s": 900.0, "tests_s": 800.0, "passed": 9,
          "deselected": 1}
    same = readme.tests({"main_job": [job, {**ci, "processor": "Intel Xeon", "cores": 2}]})
    assert "another machine" not in same and "15 min 0 s" in same
    other = readme.tests({"main_job": [job, {**ci, "processor": "AMD EPYC", "cores": 2, "prefill_ms": 812.4}]})
    assert "on another machine (AMD EPYC, 2 cores, where the prefill below reads 812 ms)" in other


def test_the_hardware_line_says_which_screen_precision_the_machine_ran_and_what_amx_would_do():
    job = {"kind": "main_job", "job": readme.MAIN_JOB, "prefill_ms": 1016.0, "cpu_flags": [],
           "screen": {"precision": "float32", "wall_s": 90.0}}
    amx = [{"kind": "screen_precision", "date": "2026-12-06", "precision": p, "seconds": s, "cpu_flags": ["amx_bf16"]}
           for p, s in (("float32", 59.7), ("bfloat16", 34.6))]
    line = readme.hardware({"main_job": [job], "performance": amx})
    assert "yours ÷ 1016 ms" in line
    assert "no AMX, so the auto profiler's screen ran in float32 (90 s" in line and "(35 s against 60 s" in line
    with_amx = readme.hardware({"main_job": [{**job, "cpu_flags": ["amx_bf16"], "screen": {"precision": "bfloat16"}}],
                                "performance": amx})
    assert "That machine has AMX, so the auto profiler's screen ran in bf16 (35 s against 60 s" in with_amx
