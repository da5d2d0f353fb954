"""What speculative decoding needs from llama.cpp: can a context roll back, and does a draft
model speak the served model's vocabulary.

Rolling back a rejected draft removes the tail of a sequence's KV (`llama_memory_seq_rm(seq,
p0, -1)`). A recurrent or hybrid model keeps one state per sequence, not one cell per
position, and cannot remove a partial range; a sliding-window cache (without swa_full, which
edge does not use) may already have dropped the old positions the rolled-back sequence needs
again. Speculation is off for those, and a request that forces it is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edge.errors import DraftVocabMismatch, InvalidRequest
from edge.runtime.llama import llama_cpp
from edge.runtime.llama.model import LlamaModel

if TYPE_CHECKING:
    from edge.runtime.types import GenerationRequest

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


def check_draft_files(target_path: Path, draft_path: Path) -> None:
    """DraftVocabMismatch, naming both vocabularies, unless the draft model's file tokenizes
    exactly as the served one's (both read vocabulary-only: a few MiB). Both files were resolved
    and validated above the runtime (`edge.host`) before llama.cpp opens them here."""
    target, draft = LlamaModel(target_path, vocab_only=True), LlamaModel(draft_path, vocab_only=True)
    try:
        check_draft_vocab(target, draft)
    finally:
        target.close()
        draft.close()


def check_speculation(request: GenerationRequest, draft_max: int, blocker: str | None, mode: str) -> None:
    """A request that forces speculation gets a 400 where it cannot run; n_draft within k."""
    if request.n_draft is not None and not 0 <= request.n_draft <= draft_max:
        raise InvalidRequest(f"n_draft must be in 0..{draft_max} (--draft-max), got {request.n_draft}",
                             "n_draft")
    if request.speculative is not True:
        return
    if blocker is not None:
        raise InvalidRequest(f"speculative decoding cannot run on this model: {blocker}", "speculative")
    if mode == "off":
        raise InvalidRequest("speculative decoding is off on this server (--speculative off)", "speculative")
