"""What a step leaves owed: the duty cycle's pause or off-thread time, and embeddings' turn.

Pure functions of plain data, beside the step plan (plan.py): the engine thread applies them
after each step and `edge sim` models the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge.runtime.types import Knobs

EMBED_SHARE = 0.5  # of the engine's time embeddings may take while chat sequences run


@dataclass(frozen=True)
class DutyAfter:
    sleep_s: float  # idle for the rest of the duty cycle (no off_threads)
    off_owed_s: float  # off-duty stepping time still owed (with off_threads)


def duty_after(knobs: Knobs, off_step: bool, off_owed_s: float, step_s: float) -> DutyAfter:
    """What a step of `step_s` leaves owed under duty < 1: a pause, or off-thread steps."""
    mixed = knobs.off_threads > 0 and knobs.duty < 1.0
    if step_s <= 0:
        return DutyAfter(0.0, off_owed_s if mixed else 0.0)
    rest_s = step_s * (1.0 - knobs.duty) / knobs.duty
    if mixed:
        return DutyAfter(0.0, max(0.0, off_owed_s - step_s if off_step else rest_s))
    return DutyAfter(rest_s if knobs.duty < 1.0 else 0.0, 0.0)


@dataclass(frozen=True)
class EmbedTurn:
    run: bool  # an embeddings batch runs now
    beside_chat: bool  # chat ran this step (the batch delays it)
    owed_s: float  # chat time still owed before the next batch (when not running now)


def embed_turn(owed_s: float, chat_s: float) -> EmbedTurn:
    """Beside running chat, embeddings get at most EMBED_SHARE of the engine's time: a batch
    (about a prompt chunk's work) runs only once chat steps have had their share since the
    last one, so a chat stalls one batch at a time and at most that often. Alone, they run
    every step."""
    if chat_s <= 0:
        return EmbedTurn(True, False, 0.0)
    owed_s -= chat_s
    return EmbedTurn(owed_s <= 0, True, owed_s)


def embed_owed_after(embed_s: float) -> float:
    """Chat time owed after an embeddings batch beside chat that took `embed_s`."""
    return embed_s * (1.0 - EMBED_SHARE) / EMBED_SHARE
