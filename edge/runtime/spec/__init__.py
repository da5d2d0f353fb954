"""Speculative decoding: the pure rules (rules.py: drafter, acceptance, cost, chooser), the
engine thread's per-sequence state (state.py), its configuration and vocabulary check
(config.py) and the draft model."""
