"""The one map from an error to the `edge` command's exit status (scripts rely on these).

0 success; 1 the command ran but failed (a typed runtime error, some bench requests failed);
2 usage or configuration (a bad flag or setting, an unknown or invalid model, a draft model
of another vocabulary, an unreachable URL); 3 a server `edge bench` had to start did not come
up; 130 interrupted.
"""

from __future__ import annotations

from edge.bench.errors import TargetStartFailed, TargetUnreachable
from edge.errors import ConfigError, DraftVocabMismatch, EdgeError, InvalidGGUF, InvalidRequest, ModelNotFound

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TARGET_START = 3
EXIT_INTERRUPTED = 130

USAGE_ERRORS = (ConfigError, InvalidRequest, ModelNotFound, InvalidGGUF, DraftVocabMismatch,
                TargetUnreachable)


def exit_status(exc: EdgeError) -> int:
    if isinstance(exc, TargetStartFailed):
        return EXIT_TARGET_START
    if isinstance(exc, USAGE_ERRORS):
        return EXIT_USAGE
    return EXIT_FAILED
