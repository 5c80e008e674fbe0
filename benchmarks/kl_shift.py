"""Where tuning moved a pruned model: KL to the teacher and NLL on evaluation text, before and after.

    python benchmarks/kl_shift.py --teacher qwen2.5-coder-0.5b --models runs/q05-gap-25,runs/distill/q05-25-decoder/model \
        --out docs/results/recovery.json

Distillation lowers the KL on its own training text by construction; this says whether it also
lowered it on WikiText-2 and PTB (first N test windows of 128 tokens), or traded it away.
Records: {"kind": "kl_shift", "teacher", "model", "dataset", "windows", "kl", "nll", "teacher_nll"}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATASETS, ResultLog, parser


@torch.no_grad()
def logits(model: torch.nn.Module, windows: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """float32 next-token logits (n, T, V) of every window."""
    return torch.cat([model(windows[i : i + batch]).logits.float() for i in range(0, len(windows), batch)])


def kl_and_nll(teacher: torch.Tensor, model: torch.Tensor, windows: torch.Tensor) -> tuple[float, float]:
    """Mean KL(teacher || model) over predicting positions, and the model's mean NLL of the next token:
    the distillation loss (`kl_full`) and the LM loss (`lm_loss`) of training, here on evaluation text."""
    from gapprune.tune.kd_loss import kl_full, lm_loss

    return kl_full(model[:, :-1], teacher[:, :-1]).item(), lm_loss(model, windows).item()


def main() -> None:
    p = parser(__doc__, out="docs/results/recovery.json")
    p.add_argument("--teacher", required=True, help="the dense model (alias, folder or GGUF)")
    p.add_argument("--models", required=True, help="comma-separated folders: the pruned one, then tuned ones")
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from gapprune.api import load
    from gapprune.data.sources import load_text
    from gapprune.data.text import bos_token_id, consecutive_windows, tokenize_text

    log = ResultLog(args.out)
    teacher, tokenizer = load(args.teacher)
    texts = {name: consecutive_windows(tokenize_text(load_text(name, "test", args.data_dir), tokenizer), 128,
                                       args.windows, bos_id=bos_token_id(tokenizer)) for name in DATASETS}
    reference = {name: logits(teacher, w) for name, w in texts.items()}
    teacher_nll = {name: kl_and_nll(reference[name], reference[name], w)[1] for name, w in texts.items()}
    del teacher
    for folder in args.models.split(","):
        model, _ = load(folder)
        for name, w in texts.items():
            kl, nll = kl_and_nll(reference[name], logits(model, w), w)
            log.emit({"kind": "kl_shift", "teacher": args.teacher, "model": folder, "dataset": name, "seq_len": 128,
                      "windows": len(w), "kl": round(kl, 4), "nll": round(nll, 4),
                      "teacher_nll": round(teacher_nll[name], 4)})
        del model


if __name__ == "__main__":
    main()
