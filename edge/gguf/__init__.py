"""GGUF model files: bounded validation and model facts, without llama.cpp."""

from edge.gguf.info import KV_TYPE_BLOCKS, GGUFInfo, TensorInfo, info_to_json, kv_row_bytes
from edge.gguf.validate import validate_gguf, validated

__all__ = ["KV_TYPE_BLOCKS", "GGUFInfo", "TensorInfo", "info_to_json", "kv_row_bytes", "validate_gguf",
           "validated"]
