"""What speculative decoding needs from llama.cpp: can a context roll back, and does a draft
model speak the served model's vocabulary.

Rolling back a rejected draft removes the tail of a sequence's KV (`llama_memory_seq_rm(seq,
p0, -1)`). A recurrent or hybrid model keeps one state per sequence, not one cell per
position, and cannot remove a partial range; a sliding-window cache (without swa_full, which
edge does not use) may already have dropped the old positions the rolled-back sequence needs
again. Speculation is off for those, and a request that forces it is refused.
"""

from __future__ import annotations

import llama_cpp

from edge.errors import DraftVocabMismatch
from edge.runtime.model import LlamaModel

VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2", 7: "test"}
MAX_VOCAB_SIZE_DIFF = 128  # as llama.cpp's common_speculative_are_compatible: padding rows only


def rollback_blocker(model: LlamaModel) -> str | None:
    """Why this model's KV cannot roll a draft back (None: it can)."""
    if llama_cpp.llama_model_is_recurrent(model.ptr):
        return "a recurrent model's state cannot remove drafted tokens"
    if llama_cpp.llama_model_is_hybrid(model.ptr):
        return "a hybrid (recurrent + attention) model's state cannot remove drafted tokens"
    if model.n_swa > 0:
        return f"a sliding-window cache (window {model.n_swa}) cannot restore positions it dropped"
    return None


def describe_vocab(model: LlamaModel) -> str:
    kind = VOCAB_TYPES.get(int(llama_cpp.llama_vocab_type(model.vocab)), "unknown")
    return f"{kind} vocabulary of {model.n_vocab} tokens"


def check_draft_vocab(target: LlamaModel, draft: LlamaModel) -> None:
    """Raise DraftVocabMismatch unless `draft` tokenizes exactly as `target`: same vocabulary type,
    special tokens and token texts (sizes may differ by padding rows only)."""

    def refuse(reason: str) -> DraftVocabMismatch:
        return DraftVocabMismatch(target.name, describe_vocab(target), draft.name, describe_vocab(draft),
                                  reason)

    t_type, d_type = llama_cpp.llama_vocab_type(target.vocab), llama_cpp.llama_vocab_type(draft.vocab)
    if t_type != d_type:
        raise refuse("the tokenizer types differ")
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_SIZE_DIFF:
        raise refuse(f"the sizes differ by {abs(target.n_vocab - draft.n_vocab)} tokens")
    if (target.bos_id, target.eos_id, target.add_bos) != (draft.bos_id, draft.eos_id, draft.add_bos):
        raise refuse(f"special tokens differ (bos {target.bos_id}/{draft.bos_id}, eos "
                     f"{target.eos_id}/{draft.eos_id})")
    for tok in range(min(target.n_vocab, draft.n_vocab)):
        if target.piece(tok, special=True) != draft.piece(tok, special=True):
            raise refuse(f"token {tok} is {target.piece(tok, special=True)!r} in one and "
                         f"{draft.piece(tok, special=True)!r} in the other")
