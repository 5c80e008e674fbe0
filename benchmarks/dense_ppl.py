"""Dense perplexity of a model on the full WikiText-2 and PTB test splits at seq-len 128 and 2048.

    python benchmarks/dense_ppl.py --model smollm2-135m --data-dir ../shared/data --out docs/results/dense.json
"""

from __future__ import annotations

import time

from common import parser, perplexities
from result_log import ResultLog
from settings import DATASETS, Window

from gapprune.api import load


def main() -> None:
    p = parser(__doc__, "docs/results/dense.json")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--seq-lens", default="128,2048")
    args = p.parse_args()

    model, tokenizer = load(args.model)
    log = ResultLog(args.out, resume=False)
    windows = [Window(d, int(t), None) for d in args.datasets.split(",") for t in args.seq_lens.split(",")]
    for window in windows:  # one at a time, so each record is written as soon as it is measured
        [(_, result)] = perplexities(model, tokenizer, [window], args.data_dir)
        log.emit({"model": args.model, **result.to_record()})


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total wall {time.perf_counter() - t0:.0f} s")
