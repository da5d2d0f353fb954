"""Contract types shared across the data flow (telemetry -> scheduler -> runtime -> api).

Leaf modules: nothing here imports anything of edge's, so every package may import them
and none has to import a package above it to name what it hands over.
"""
