"""Embeddings: the pooled, L2-normalised embeddings context (embedder.py) and its job queue on
the engine thread (queue.py)."""
