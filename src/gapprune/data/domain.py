"""Calibrate on the model's own domain: a code model gets Python source unless the user names a text.

The loss table is measured on the calibration text, so the plan keeps what that text needs. Calibrated on
WikiText-2 (prose), Qwen2.5-Coder-1.5B at 25% of its decoder kept 2 of HumanEval's 164 problems (87 dense); on
Python source it kept 51, and on text it wrote itself (`self`, no data set) 47 (`docs/results/skills.json`): a
code model with no Python source at hand calibrates on its own text, not on prose. A model is taken for a code
model by its name (the last part of the alias, hub id or folder it was given, or of the `_name_or_path` its config
keeps: a folder under `~/code/` is not a code model) or its model type.

An instruction model (its name says instruct, chat or it) keeps the general default, with a note naming
`--calib alpaca`: on SmolLM2-135M-Instruct at 25% that calibration kept held-out Alpaca perplexity at 21.5 against
34.3 but doubled WikiText-2's (190 against 94; `skill_ppl` records in `docs/results/skills.json`), a trade the user
should make, not the default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

GENERAL_DEFAULT = "wikitext2"
CODE_SET = "code"
SELF_SET = "self"  # what a code model writes unprompted is code: the next best calibration when no code is at hand
CODE_NAME = re.compile(r"(?<![a-z])(code|coder|codellama|starcoder\w*|codegen\w*|codestral|codegemma)(?![a-z])",
                       re.IGNORECASE)
CODE_MODEL_TYPES = ("starcoder2", "gpt_bigcode", "codegen")
INSTRUCTION_SET = "alpaca"
INSTRUCTION_NAME = re.compile(r"(?<![a-z])(instruct|chat|it)(?![a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class CalibrationChoice:
    """The calibration text a prune uses when none is named, and the one line that says why."""

    calib: str
    message: str | None  # printed before the work; None for the general default


def name_evidence(pattern: re.Pattern[str], spec: str, config: Any) -> str | None:
    """"its name says 'coder'" when the model's own name (not its parent folders) matches `pattern`, or None."""
    for name in (spec, str(getattr(config, "_name_or_path", "") or "")):
        found = pattern.search(PurePath(name).name.replace("_", "-"))
        if found:
            return f"its name says {found.group(1).lower()!r}"
    return None


def code_model_evidence(spec: str, config: Any) -> str | None:
    """What marks the model as a code model ("its name says 'coder'"), or None."""
    if evidence := name_evidence(CODE_NAME, spec, config):
        return evidence
    model_type = getattr(config, "model_type", "")
    if model_type in CODE_MODEL_TYPES:
        return f"its model type is {model_type}"
    return None


def default_calibration(spec: str, config: Any, code_available: bool) -> CalibrationChoice:
    """`code` for a code model when the data folder holds it, else its own text (`self`); the general default for
    every other model (with a note for an instruction model)."""
    evidence = code_model_evidence(spec, config)
    if evidence is None:
        if instruction := name_evidence(INSTRUCTION_NAME, spec, config):
            return CalibrationChoice(GENERAL_DEFAULT, f"note: {spec} looks like an instruction model ({instruction}): "
                                     f"calibrating on prose ({GENERAL_DEFAULT}); --calib {INSTRUCTION_SET} keeps "
                                     "instructions better and prose worse (docs/usage.md, Data)")
        return CalibrationChoice(GENERAL_DEFAULT, None)
    if code_available:
        return CalibrationChoice(CODE_SET, f"{spec} looks like a code model ({evidence}): calibrating on Python "
                                 f"source (--calib {CODE_SET}); pass --calib {GENERAL_DEFAULT} to calibrate on prose")
    return CalibrationChoice(SELF_SET, f"{spec} looks like a code model ({evidence}) but the data folder has no "
                             f"Python source, so it calibrates on text it writes itself (--calib {SELF_SET}: slower, "
                             "it generates first; keeps a code model's skill nearly as well as code and far better "
                             f"than prose); give --data-dir a folder with code/, --calib FILE.py, or --calib "
                             f"{GENERAL_DEFAULT} to calibrate on prose")
