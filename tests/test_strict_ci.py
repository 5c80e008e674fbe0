"""Under .ci/run ($GAPPRUNE_STRICT) a lost data folder or a skipped test fails the run instead of passing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, STRICT_ENV


def run_pytest(args: list[str], data: Path, strict: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GAPPRUNE_DATA": str(data)}
    env.pop(STRICT_ENV, None)
    if strict:
        env[STRICT_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)


def test_an_empty_data_folder_stops_a_strict_run_before_any_test(tmp_path):
    done = run_pytest(["tests/allocate/test_knapsack.py"], tmp_path, strict=True)
    assert done.returncode == 3, done.stdout[-2000:]
    assert f"data folder {tmp_path} lacks wikitext-2-raw" in done.stdout + done.stderr


def test_a_skipped_test_fails_a_strict_run_and_not_a_developers(tmp_path, data_dir):
    (tmp_path / "test_parts.py").write_text(
        "import pytest\n\ndef test_needs_a_part():\n    pytest.skip('a part is missing')\n\n"
        "@pytest.mark.xfail(strict=True)\ndef test_known_gap():\n    assert False\n\ndef test_fine():\n    pass\n")
    args = ["-p", "tests.conftest", "--rootdir", str(tmp_path), str(tmp_path / "test_parts.py")]
    strict = run_pytest(args, data_dir, strict=True)
    assert strict.returncode == 1 and "1 tests skipped" in strict.stdout, strict.stdout[-2000:]
    assert run_pytest(args, data_dir, strict=False).returncode == 0
