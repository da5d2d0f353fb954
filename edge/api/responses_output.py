"""A response's output items and stream events, built from the tool-call scanner's events.

`OutputBuilder` is fed content and tool-call events as the model decodes (the same for a
streamed and a whole response, so both give the same output) and returns the Responses
stream events each step produces, each with its `sequence_number`:

    response.created, response.in_progress,
    reasoning:   output_item.added, reasoning_text.delta..., reasoning_text.done, output_item.done
    per message: output_item.added, content_part.added, output_text.delta..., output_text.done,
                 content_part.done, output_item.done
    per call:    output_item.added, function_call_arguments.delta..., function_call_arguments.done,
                 output_item.done
    response.completed | response.incomplete | (error, response.failed)

Text before a call is one message item, text after it another; a think block is one reasoning
item (its text as `reasoning_text` content, no summary) before them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from edge.toolcalls import ArgsDelta, CallStart, ParsedCall


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class OutputBuilder:
    status_of_items: str = "completed"  # what finished items say; "incomplete" when output was cut
    seq: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)
    _msg: dict[str, Any] | None = None  # the open message item
    _rs: dict[str, Any] | None = None  # the open reasoning item
    _calls: dict[int, int] = field(default_factory=dict)  # call index -> output index

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    # --- reasoning ---------------------------------------------------------------------------
    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        out: list[dict[str, Any]] = []
        if self._rs is None:
            self._rs = {"id": _id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}]}
            self.output.append(self._rs)
            out.append(self.event("response.output_item.added", output_index=len(self.output) - 1,
                                  item=_copy(self._rs)))
        self._rs["content"][0]["text"] += delta
        out.append(self.event("response.reasoning_text.delta", item_id=self._rs["id"],
                              output_index=self._index(self._rs), content_index=0, delta=delta))
        return out

    def close_reasoning(self, status: str | None = None) -> list[dict[str, Any]]:
        rs, self._rs = self._rs, None
        if rs is None:
            return []
        index = self._index(rs)
        rs["status"] = status or "completed"
        return [self.event("response.reasoning_text.done", item_id=rs["id"], output_index=index,
                           content_index=0, text=rs["content"][0]["text"]),
                self.event("response.output_item.done", output_index=index, item=_copy(rs))]

    # --- text --------------------------------------------------------------------------------
    def text(self, delta: str) -> list[dict[str, Any]]:
        if not delta:
            return []
        out = self.close_reasoning()
        if self._msg is None:
            self._msg = {"id": _id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                         "content": []}
            self.output.append(self._msg)
            out.append(self.event("response.output_item.added", output_index=len(self.output) - 1,
                                  item=_copy(self._msg)))
            self._msg["content"].append(_empty_part())
            out.append(self.event("response.content_part.added", item_id=self._msg["id"],
                                  output_index=len(self.output) - 1, content_index=0, part=_empty_part()))
        self._msg["content"][0]["text"] += delta
        out.append(self.event("response.output_text.delta", item_id=self._msg["id"],
                              output_index=self._index(self._msg), content_index=0, delta=delta, logprobs=[]))
        return out

    def close_text(self, status: str | None = None) -> list[dict[str, Any]]:
        msg, self._msg = self._msg, None
        if msg is None:
            return []
        index = self._index(msg)
        part = msg["content"][0]
        msg["status"] = status or "completed"
        return [
            self.event("response.output_text.done", item_id=msg["id"], output_index=index, content_index=0,
                       text=part["text"], logprobs=[]),
            self.event("response.content_part.done", item_id=msg["id"], output_index=index, content_index=0,
                       part=_copy(part)),
            self.event("response.output_item.done", output_index=index, item=_copy(msg)),
        ]

    # --- calls -------------------------------------------------------------------------------
    def call_start(self, start: CallStart) -> list[dict[str, Any]]:
        out = self.close_reasoning() + self.close_text()
        item = {"id": _id("fc"), "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": start.id, "name": start.name}
        self.output.append(item)
        self._calls[start.index] = len(self.output) - 1
        out.append(self.event("response.output_item.added", output_index=len(self.output) - 1,
                              item=_copy(item)))
        return out

    def call_args(self, delta: ArgsDelta) -> list[dict[str, Any]]:
        index = self._calls[delta.index]
        item = self.output[index]
        item["arguments"] += delta.text
        return [self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                           delta=delta.text)]

    def call_end(self, call: ParsedCall, call_index: int) -> list[dict[str, Any]]:
        index = self._calls[call_index]
        item = self.output[index]
        item["arguments"] = call.arguments
        item["status"] = "completed"
        return [
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       name=call.name, arguments=call.arguments),
            self.event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def feed(self, events: list[tuple[str, Any]], n_ended: int) -> tuple[list[dict[str, Any]], int]:
        """Stream events for scanner events; `n_ended` counts calls ended so far (returned updated)."""
        out: list[dict[str, Any]] = []
        for kind, value in events:
            if kind == "content":
                out += self.text(value)
            elif kind == "call_start":
                out += self.call_start(value)
            elif kind == "call_args":
                out += self.call_args(value)
            else:
                out += self.call_end(value, n_ended)
                n_ended += 1
        return out, n_ended

    def finish(self, incomplete: bool) -> list[dict[str, Any]]:
        """Close what is open; items of a cut output are `incomplete`."""
        status = "incomplete" if incomplete else "completed"
        out = self.close_reasoning(status) + self.close_text(status)
        for item in self.output:
            if item["status"] == "in_progress":
                item["status"] = status
        return out

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, it in enumerate(self.output) if it is item)

    def conversation_items(self) -> list[dict[str, Any]]:
        """The output as input items for a later turn (`previous_response_id`)."""
        items: list[dict[str, Any]] = []
        for it in self.output:
            if it["type"] == "message":
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": it["content"][0]["text"]}]})
            elif it["type"] == "reasoning":
                items.append({"type": "reasoning", "id": it["id"], "summary": []})
            else:
                items.append({"type": "function_call", "call_id": it["call_id"], "name": it["name"],
                              "arguments": it["arguments"]})
        return items


def _empty_part() -> dict[str, Any]:
    return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot for an event (the builder goes on mutating its own item)."""
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out
