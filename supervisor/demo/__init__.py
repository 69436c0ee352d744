"""The embedded demo workload: a mock OpenAI-compatible server, the reference ``run_inference.py``
client, deterministic prompts, a tiny locally built tokenizer, and the ``runwatch demo`` launcher.

Everything here runs with no GPU and no network, so every part of runwatch can be shown and tested.
"""
