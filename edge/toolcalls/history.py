"""Earlier tool calls as chat templates want them: arguments as a mapping that also prints as JSON."""

from __future__ import annotations

import json
from typing import Any


class JsonArgs(dict):  # type: ignore[type-arg]
    """Tool-call arguments handed to a template: a mapping (for `arguments | tojson`, as Qwen's
    and Llama's templates do), whose plain `{{ arguments }}` also prints as JSON."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)


def template_arguments(arguments: str | dict[str, Any]) -> Any:
    """A call's arguments (JSON text or an object) for a template: JsonArgs when they are an object."""
    if isinstance(arguments, dict):
        return JsonArgs(arguments)
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments  # not JSON: the template gets the text as sent
    return JsonArgs(parsed) if isinstance(parsed, dict) else arguments
