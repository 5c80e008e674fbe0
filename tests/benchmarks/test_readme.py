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
    text = README.read_text()
    assert set(readme.BLOCKS) <= {m["name"] for m in readme.BLOCK.finditer(text)}
    assert readme.render(text, readme.load_records()) == text, "stale README: run python benchmarks/readme.py"


def test_readme_prose_restates_no_measured_number_and_stays_short():
    text = README.read_text()
    assert len(text.splitlines()) <= 130
    found = [m.group(0) for m in MEASURED.finditer(prose(text))]
    assert not found, f"numbers outside the rendered blocks: {found}"


def row(model: str, allocator: str, compensate: str, dataset: str, ppl: float, **extra: object) -> dict:
    return {"kind": "ppl", "model": model, "allocator": allocator, "compensate": compensate, "dataset": dataset,
            "ppl": ppl, "target_ratio": 0.0 if allocator == "dense" else 0.25, "ratio_of": "model", "windows": 256,
            "criterion": "obs", "profiler": "auto", **extra}


def test_the_table_takes_the_latest_record_of_the_default_calibration_and_the_best_baseline():
    records = [row("smollm2-135m", "dense", "none", d, 50.0) for d in ("wikitext2", "ptb")]
    for dataset, gap, owl, depth in (("wikitext2", 90.0, 110.0, 120.0), ("ptb", 170.0, 260.0, 240.0)):
        records += [row("smollm2-135m", "gap", "lsq", dataset, gap + 5), row("smollm2-135m", "gap", "lsq", dataset, gap),
                    row("smollm2-135m", "owl", "lsq", dataset, owl), row("smollm2-135m", "depth", "lsq", dataset, depth),
                    row("smollm2-135m", "gap", "lsq", dataset, 1.0, calibration="c4"),  # another calibration
                    row("smollm2-135m", "gap", "lsq", dataset, 2.0, calib="wikitext2+ptb")]
    table = readme.results({"allocators": records})
    assert "| wikitext2 | **90.0* / 170.0 / —** | 110.0* / 260.0 / — (owl) | 18% / 35% / — |" in table
    assert "| c4 |" not in table  # the C4-calibrated GAP has no baseline to stand beside
    with pytest.raises(LookupError, match="no record of"):
        readme.main_job({"main_job": []})


def test_an_unknown_block_is_an_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="has no renderer"):
        readme.render("<!-- rendered:nonsense -->\n<!-- /rendered -->", {})
