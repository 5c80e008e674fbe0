"""Running the model again from cached inputs: the one engine under every profiler.

capture.py      one dense pass caching every decoder layer's input (`LayerInputs`); `replay_layer`, one layer
                over its cached inputs (Gram replays, sequential compensation)
observe.py      observers: what a client wants done with a module's input during a pass (statistics,
                Grams); the engine installs and removes the hooks
masks.py        one definition of a unit mask: in the weights (`UnitMasks`) or per row group of a
                projection's input (`option_masks`: stacked copies; `scaled_inputs`: samples)
replay.py       replays from one start layer, several options per pass (`measure_entries`)
layer_major.py  the layer-major schedule: every replay advances through layer j together
head.py         the LM head and logsumexp in bounded memory against a hidden-sized dense reference
metrics.py      the metrics (KL, NLL), defined once

Clients (the profilers, refinement, the plan check, Gram collection, sequential compensation) say which
units to keep and what to observe; no code outside the engine calls a decoder layer or hooks a module
(`tests/profiling/test_engine_boundary.py`). The engine knows no
importance scores and no option vocabulary beyond "option 0 is dense".
"""
