"""Where the solves on Gram matrices run: on the GPU that accumulated them when it can hold them, else
the CPU. The rule is checked here with the GPU's free memory stubbed; tests/gpu runs it for real."""

from __future__ import annotations

import torch

from gapprune.calibrate import gram as gram_module
from gapprune.calibrate.gram import SOLVE_HEADROOM, GramStats, TokenGram, solve_device


def test_a_cpu_gram_is_solved_on_the_cpu():
    assert solve_device(torch.device("cpu"), 1) == torch.device("cpu")


def test_a_gpu_keeps_its_grams_while_its_free_memory_holds_the_solve(monkeypatch):
    cuda = torch.device("cuda", 0)
    free = {"bytes": 10 * 2**20}
    monkeypatch.setattr(gram_module.torch.cuda, "mem_get_info", lambda device: (free["bytes"], 80 * 2**30))
    assert solve_device(cuda, free["bytes"] // SOLVE_HEADROOM) == cuda
    assert solve_device(cuda, free["bytes"] // SOLVE_HEADROOM + 1) == torch.device("cpu")


def test_settling_cpu_statistics_leaves_them_where_they_are():
    square, rows = torch.eye(4), TokenGram(4, [torch.ones(2, 4)])
    stats = GramStats(fit={(0, "attn"): square, (0, "mlp"): rows}, held_out={(0, "attn"): square, (0, "mlp"): rows},
                      sums={(0, "attn"): [torch.zeros(4, dtype=torch.float64)] * 2}, counts={(0, "attn"): [1, 1]})
    stats.settle_()
    assert stats.fit[(0, "attn")] is square  # no copy on the CPU
    assert stats.fit[(0, "mlp")].device == torch.device("cpu") and stats.fit[(0, "mlp")].nbytes == 32
