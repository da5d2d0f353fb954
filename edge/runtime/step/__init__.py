"""One engine step: the plan (plan.py, slots.py, duty.py: pure decisions) and its execution
(loop.py, kvops.py, delivery.py), the per-request `Sequence` and the published stats."""
