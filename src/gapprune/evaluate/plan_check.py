"""How far the DP's additivity assumption held: the plan's predicted summed ΔL beside the measured one.

GAP measures each component's ΔL with that component alone pruned and assumes the drops add up.
The check prunes them all at once and measures the model's ΔL by the table's own metric, on
calibration windows the plan was not fitted on: first with the plan's units masked in the dense
model (exactly what the table predicts, no compensation; masking equals removal), then on the
pruned and compensated model that is saved. Three forward passes over a few windows: seconds.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from gapprune.engine.masks import option_masks
from gapprune.engine.metrics import METRICS
from gapprune.models import get_adapter
from gapprune.pruning.plan import Plan


def _metric_sum(metric: str, dense: torch.Tensor, logits: torch.Tensor, ids: torch.Tensor) -> tuple[float, int]:
    """Σ over one window's positions of const + lse(z) − q·z (`engine/metrics.py`), and the position count."""
    spec = METRICS.get(metric)
    positions = ids.shape[0] - spec.shift
    q, const = spec.target(dense[:positions].float(), ids[1 : positions + 1] if spec.shift else None)
    z = logits[:positions].float()
    cross = z.gather(-1, q[:, None])[:, 0] if q.dtype == torch.long else (q * z).sum(-1)
    return float((const + torch.logsumexp(z, dim=-1) - cross).double().sum()), positions


@torch.inference_mode()
def _logits(model: PreTrainedModel, window: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    return model(input_ids=window[None].to(device)).logits[0].float().cpu()


def _plan_masks(model: PreTrainedModel, plan: Plan) -> contextlib.ExitStack:
    """Every unit the plan removes, masked at once in the dense model."""
    adapter = get_adapter(model)
    stack = contextlib.ExitStack()
    for lp in plan.layers:
        for component in ("attn", "mlp"):
            out = adapter.out_proj(lp.layer, component)
            kept = lp.component(component).kept
            if out is not None and len(kept) < out.in_features // adapter.unit_width(component):
                stack.enter_context(option_masks(adapter, lp.layer, component, [kept]))
    return stack


def _significant(value: float) -> float:
    return float(f"{value:.6g}")


@dataclass
class PlanCheck:
    """The dense side of the check, taken before surgery: the dense logits (float16, on the CPU:
    311 MB for eight windows of a 152k vocabulary) and the masked model's ΔL."""

    windows: torch.Tensor  # (n, T) held-out calibration token ids
    metric: str
    dense: list[torch.Tensor]
    dense_mean: float
    masked_dl: float

    @classmethod
    def before_surgery(cls, model: PreTrainedModel, plan: Plan, windows: torch.Tensor, metric: str) -> PlanCheck:
        dense = [_logits(model, w) for w in windows]
        dense_mean = cls._mean(metric, dense, dense, windows)
        with _plan_masks(model, plan):
            masked = [_logits(model, w) for w in windows]
        masked_dl = cls._mean(metric, dense, masked, windows) - dense_mean
        return cls(windows, metric, [d.half() for d in dense], dense_mean, masked_dl)

    @staticmethod
    def _mean(metric: str, dense: list[torch.Tensor], logits: list[torch.Tensor], windows: torch.Tensor) -> float:
        total, positions = 0.0, 0
        for d, z, w in zip(dense, logits, windows):
            s, n = _metric_sum(metric, d, z, w)
            total, positions = total + s, positions + n
        return total / positions

    def after_surgery(self, model: PreTrainedModel, predicted: float | None) -> dict[str, Any]:
        """The record: predicted summed ΔL, measured with the units masked and on the saved model."""
        pruned = [_logits(model, w) for w in self.windows]
        dense = [d.float() for d in self.dense]
        saved_dl = self._mean(self.metric, dense, pruned, self.windows) - self._mean(self.metric, dense, dense, self.windows)
        return {
            "metric": self.metric,
            "windows": int(self.windows.shape[0]),
            "seq_len": int(self.windows.shape[1]),
            "predicted": None if predicted is None else _significant(predicted),
            "measured_masked": _significant(self.masked_dl),
            "measured_saved": _significant(saved_dl),
            "masked_over_predicted": None if not predicted else round(self.masked_dl / predicted, 4),
        }
