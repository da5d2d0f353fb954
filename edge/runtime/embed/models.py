"""The models embeddings run on: a context over the served weights, or a second model named for
embeddings (`--embedding-model`), whose weights load on first use and go with an unload, while
its vocabulary stays for tokenizing inputs on any thread."""

from __future__ import annotations

from collections.abc import Callable

from edge.runtime.embed.embedder import Embedder
from edge.runtime.llama.model import LlamaModel


class EmbedModels:
    """What `Residency` holds for embeddings (engine thread, except `vocab` under its lock)."""

    def __init__(self, path: str | None, n_gpu_layers: int = 0) -> None:
        self.path = path  # a second model for embeddings (None: the served one)
        self.n_gpu_layers = n_gpu_layers
        self.embedder: Embedder | None = None
        self._weights: LlamaModel | None = None  # the second model's weights, when loaded
        self._vocab: LlamaModel | None = None  # its vocabulary, for tokenizing on any thread

    def vocab(self, served: Callable[[], LlamaModel]) -> LlamaModel:
        """The model whose tokenizer embedding inputs use."""
        if self.path is None:
            return served()
        if self._vocab is None:
            self._vocab = LlamaModel(self.path, vocab_only=True)
        return self._vocab

    def get(self, served: LlamaModel | None, n_threads: int) -> Embedder:
        """The embeddings context, made on first use (needs the weights loaded)."""
        if self.embedder is None:
            model = served
            if self.path is not None:
                if self._weights is None:
                    self._weights = LlamaModel(self.path, n_gpu_layers=self.n_gpu_layers)
                model = self._weights
            assert model is not None and not model.vocab_only
            self.embedder = Embedder(model, n_threads)
        return self.embedder

    def release(self) -> None:
        """The context and the second model's weights go (an unload: they run over weights)."""
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        if self._weights is not None:
            self._weights.close()
            self._weights = None

    def close(self) -> None:
        """Everything, the vocabulary too (engine stopped)."""
        self.release()
        if self._vocab is not None:
            self._vocab.close()
            self._vocab = None
