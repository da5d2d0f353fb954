"""edge: an on-device LLM inference runtime that throttles before the device does."""

__version__ = "0.1.0"
