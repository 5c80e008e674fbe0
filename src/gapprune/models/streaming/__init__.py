"""A model whose decoder layers stay on disk: about one layer's weights in memory at a time.

`open_streamed(folder)` builds the model on the meta device (no memory, no random init), loads the
weights outside the decoder layers (embeddings, final norm, LM head) and leaves every layer's
parameters on meta. A layer's weights are read from the safetensors files when it is needed, and
every other layer is dropped back to meta at that moment, so at most one layer is resident:

* a forward pre-hook loads a layer as the model reaches it (capture, evaluation, generation);
* `adapter.layers[i]` loads layer i (the list is a `StreamedLayers`), so scoring, signals, the
  layer-major profiler, surgery and compensation, which all go through the adapter layer by layer,
  work unchanged.

A layer that was changed while resident (surgery, compensation: its parameters are no longer the
tensors that were loaded) is written to a scratch folder when dropped and read from there after.
`save_streamed` writes the model layer by layer as sharded safetensors with an index, which
`from_pretrained` loads. Reads go through `os.preadv` into preallocated tensors, not through a
memory map, so the file pages count against the page cache rather than the process's memory.

The package splits by job: `safetensors_io` (headers, reads, writes), `streamer` (the layer
streamer and `open_streamed`), `save` (`save_streamed`) and `policy` (`should_stream`, `memory_need`, `auto_stream_warning`).
"""

from gapprune.models.streaming.policy import (
           auto_stream_warning,
           available_bytes,
           memory_need,
           should_stream,
           weights_bytes,
)
from gapprune.models.streaming.safetensors_io import (
           INDEX_FILE,
           folder_sources,
           read_tensor,
           write_safetensors,
)
from gapprune.models.streaming.save import save_streamed
from gapprune.models.streaming.streamer import LayerStreamer, is_streamed, open_streamed, streamer_of

__all__ = ["INDEX_FILE", "LayerStreamer", "auto_stream_warning", "available_bytes", "folder_sources", "is_streamed", "memory_need",
           "open_streamed", "read_tensor", "save_streamed", "should_stream", "streamer_of", "weights_bytes",
           "write_safetensors"]
