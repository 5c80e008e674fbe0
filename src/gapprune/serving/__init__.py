"""Serving pruned folders in other engines: vLLM's plugin and its model classes.

A new engine goes here as one module that registers gapprune's architecture names with it; the model
classes import only that engine, torch and transformers, since they run inside its processes.
"""
