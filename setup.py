"""Install edge: `pip install -e .` (add `[dev]` for tests, `[jetson]` on a Jetson)."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="edge",
    version="0.1.0",
    description="On-device LLM inference runtime that throttles before the device does",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["edge", "edge.*"]),
    include_package_data=True,
    # the chat page served at /; the default text and prompt set of `edge eval` (see its README);
    # configs/ and models/catalog.toml through the links under edge/data (copied into the wheel)
    package_data={"edge": ["py.typed", "api/static/*.html", "data/eval/*.txt", "data/eval/*.md",
                           "data/eval/*.jsonl",
                           "data/catalog.toml", "data/configs/*.toml", "data/configs/devices/*.toml",
                           "data/configs/throughput/*.json", "data/configs/templates/*.jinja"]},
    install_requires=[
        "numpy>=1.24",
        # The low-level API (batch, memory, sampler chain) moves between releases:
        # pinned to the version the engine is tested against.
        "llama-cpp-python==0.3.36",
        "gguf>=0.17,<0.20",
        "psutil>=5.9",
        "fastapi>=0.110",
        "uvicorn>=0.29",
        # uvicorn's C event loop and HTTP parser (what `uvicorn[standard]` adds, without its
        # reloader and WebSocket stacks): the event loop shares a 2-core box with the decode
        # threads, and with asyncio + h11 it spent 0.30 ms of CPU per streamed token, 0.21 ms
        # with these (SmolLM2, one stream; most of what is left is the socket write itself)
        "uvloop>=0.19; sys_platform != 'win32'",
        "httptools>=0.6",
        "pydantic>=2.6",
        "pydantic-settings>=2.3",  # typed settings with env + TOML sources
        "jinja2>=3.1",  # sandboxed chat templates
        "prometheus-client>=0.20",  # /metrics text format and its parser
        "sse-starlette>=2.0",  # SSE framing, pings and disconnect detection
        "tqdm>=4.66",  # download progress on a terminal, per-step bars of `edge bench http`
        "httpx>=0.27",  # `edge bench http`: async streaming load generator (and `edge report`)
        "matplotlib>=3.7",  # `edge report`'s PNG plots (Agg backend: no display needed)
        "platformdirs>=4.0",  # per-user model store on every OS
        "tomli>=2.0; python_version<'3.11'",
    ],
    extras_require={
        "jetson": ["jetson-stats>=4.2"],
        "dev": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "ruff>=0.6",
            "openai>=1.40",  # end-to-end tests drive the server with the official SDK
            "ollama>=0.5",  # ... and Ollama's own Python client against /api/*
            "langchain-ollama>=0.3",  # one LangChain chat model (ChatOllama) against /api/chat
            # `edge bench http --compare llama-cpp-python` runs llama-cpp-python's own server,
            # which needs its `server` extra beyond what edge already installs
            "starlette-context>=0.3.6,<0.4",
            "PyYAML>=5.1",
            # the chat page's browser test drives Debian's /usr/bin/chromium (never `playwright install`)
            "playwright>=1.40",
            # the API fuzz test generates requests from /openapi.json (tests/unit/test_api_fuzz.py)
            "schemathesis>=4.0,<5",
            # a LangChain chat model pointed at edge (tests/e2e/test_responses_e2e.py)
            "langchain-openai>=0.3",
        ],
    },
    entry_points={"console_scripts": ["edge=edge.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Operating System :: MacOS",
    ],
)
