"""report.md for a pruning run: the configuration, the budget reached, and the per-layer plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gapprune.prune.plan import Plan


def render_report(plan: Plan, timings: dict[str, float], evaluation: list[dict[str, Any]] | None = None) -> str:
    s = plan.summary
    lines = [
        "# gapprune report",
        "",
        f"- allocator `{s.get('allocator')}`, criterion `{plan.config.get('criterion')}`, metric `{plan.config.get('metric')}`",
        (f"- parameters: {s['params_before']:,} → {s['params_after']:,} "
         f"(removed {s['params_removed']:,} = {100 * s['achieved_ratio']:.2f}% of the model, "
         f"{100 * s['decoder_ratio']:.2f}% of the decoder layers; "
         f"target {100 * plan.config.get('ratio', 0):.2f}% of the {plan.config.get('ratio_of', 'model')})"),
        f"- predicted summed ΔL: {s.get('predicted_loss', float('nan')):.4f}",
        "",
    ]
    if timings:
        lines += ["## Time per phase", "", "| phase | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in timings.items()]
        lines.append("")
    if evaluation:
        lines += ["## Evaluation", "", "| model | dataset | seq_len | windows | ppl |", "|---|---|---|---|---|"]
        lines += [
            f"| {e['model']} | {e['dataset']} | {e['seq_len']} | {e['windows']} | {e['ppl']:.3f} |" for e in evaluation
        ]
        lines.append("")
    lines += [
        "## Per layer",
        "",
        "![kept fraction](kept_fraction.png)",
        "",
        "| layer | heads kept | KV groups | attn rate | attn ΔL | MLP channels | MLP rate | MLP ΔL |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lp in plan.layers:
        g = lp.attn.option[0]
        lines.append(
            f"| {lp.layer} | {len(lp.attn.kept)} | {g} | {lp.attn.rate:.3f} | {lp.attn.loss or 0:.4f} "
            f"| {len(lp.mlp.kept)} | {lp.mlp.rate:.3f} | {lp.mlp.loss or 0:.4f} |"
        )
    lines += ["", "![loss table](loss_table.png)", ""]
    return "\n".join(lines)


def write_report(path: str | Path, plan: Plan, timings: dict[str, float], evaluation: list[dict[str, Any]] | None = None) -> None:
    Path(path).write_text(render_report(plan, timings, evaluation))
