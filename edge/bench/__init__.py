"""`edge bench http` and `edge report`: load tests against OpenAI-compatible servers.

Kept apart from edge/api and edge/runtime on purpose: the load generator is a
client, it must measure any server (edge, llama-server, Ollama, llama-cpp-python)
the same way, and it never imports the engine it measures.

- `workload.py`  prompt and max_tokens distributions, deterministic prompts per seed
- `load.py`      the asyncio closed-loop ladder over httpx streaming requests
- `stats.py`     percentiles, per-step figures and the knee
- `targets.py`   which server to measure: a URL, or one this process starts and stops
- `runner.py`    the whole run: targets x ladder, status timeline, the JSON document
- `sweep.py`, `recommend.py`  --slots-sweep: one ladder per started --slots, the recommended setting
- `table.py`     the terminal table
- `plots.py`, `report.py`  PNG plots and report.md for `edge report`
"""
