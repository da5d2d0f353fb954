"""KV residency: the model and context that are loaded or not (residency.py) and idle prompt
caches in host memory (hostcache.py)."""
