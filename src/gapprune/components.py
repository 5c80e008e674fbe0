"""The two prunable components of a decoder layer (DESIGN §1), in the order tables and plans use."""

COMPONENTS = ("attn", "mlp")
