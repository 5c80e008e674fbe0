"""report.md for a pruning run: the configuration, the budget reached, and the per-layer plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gapprune.pruning.plan import Plan


def target(plan: Plan) -> str:
    """The budget the plan was solved for, in its own units (plans saved before budgets: the ratio)."""
    from gapprune.budget import budget_from_record

    if "budget" in plan.summary:
        return budget_from_record(plan.summary["budget"]).describe()
    return f"{100 * (plan.config.get('ratio') or 0):.2f}% of the {plan.config.get('ratio_of', 'model')}"


def plan_check_lines(check: dict[str, Any] | None) -> list[str]:
    """Whether the ΔL added up: the measured pruned model beside the DP's sum (`profiling/plan_check.py`)."""
    if not check:
        return []
    if "skipped" in check:
        return [f"- plan check skipped: {check['skipped']}"]
    ratio = check.get("masked_over_predicted")
    return [(
        f"- measured ΔL ({check['metric']}) on {check['windows']} held-out calibration windows of {check['seq_len']} tokens: "
        f"{check['measured_masked']:.4f} with the plan's units masked (the table's assumption: "
        f"{'n/a' if ratio is None else f'{ratio:.2f}× the predicted sum'}), "
        f"{check['measured_saved']:.4f} for the saved, compensated model"
    )]


def predicted_line(summary: dict[str, Any]) -> str:
    predicted = summary.get("predicted_loss")
    if predicted is None:  # a baseline on a cost-only table: its ΔL were never measured
        return f"- predicted summed ΔL: none (allocator `{summary.get('allocator')}` does not read ΔL)"
    return f"- predicted summed ΔL: {predicted:.4f}"


def added_bias_lines(summary: dict[str, Any]) -> list[str]:
    """The parameters compensation adds (output-projection biases): in the saved model, not in the ratio."""
    with_biases = summary.get("params_after_with_added_biases")
    if not with_biases or with_biases == summary["params_after"]:
        return []
    net = f" (with them counted, {100 * summary['achieved_ratio_with_added_biases']:.2f}% of the model is removed)" \
        if "achieved_ratio_with_added_biases" in summary else ""
    return [(f"- the saved model holds {with_biases:,} parameters: the {with_biases - summary['params_after']:,} "
            f"output-projection biases compensation added are not counted in the removed share above{net}")]


def render_report(plan: Plan, timings: dict[str, float], evaluation: list[dict[str, Any]] | None = None) -> str:
    s = plan.summary
    lines = [
        "# gapprune report",
        "",
        f"- allocator `{s.get('allocator')}`, criterion `{plan.config.get('criterion')}`, metric `{plan.config.get('metric')}`",
        (f"- parameters: {s['params_before']:,} → {s['params_after']:,} "
         f"(removed {s['params_removed']:,} = {100 * s['achieved_ratio']:.2f}% of the model, "
         f"{100 * s['decoder_ratio']:.2f}% of the decoder layers; "
         f"target {target(plan)})"),
        *added_bias_lines(s),
        predicted_line(s),
        *plan_check_lines(s.get("plan_check")),
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
