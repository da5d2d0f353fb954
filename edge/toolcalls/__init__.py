"""Tool calls in model output, independent of any wire format: the incremental parser
(`scan`), the JSON-prefix reader that lets a call stream while it decodes (`live`), and what
chat templates need to show earlier calls (`history`). Imported by the HTTP API and by the
CLI (`edge run/chat --tools`), so it imports nothing from either (nor from the runtime)."""

from edge.toolcalls.history import JsonArgs, template_arguments
from edge.toolcalls.scan import ArgsDelta, CallScanner, CallStart, ParsedCall, calls_in, new_call_id

__all__ = ["ArgsDelta", "CallScanner", "CallStart", "JsonArgs", "ParsedCall", "calls_in", "new_call_id",
           "template_arguments"]
