"""Runtime: the only package that imports llama_cpp."""
