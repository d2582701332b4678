"""Tool calls read as the model writes them (tools.py's Hermes form), so that a stream carries
them as OpenAI streams its own: for each call, a first delta with its index, id, type and
function name (arguments ""), then the arguments' text in fragments as it is written.

`ToolStream.push(text)` takes the output's next text and returns what it now knows, in order:
("content", text), ("call", index, id, name) and ("args", index, fragment); `finish()` what is
left at the end. Text before, between and after the calls is content; a piece that may be the
start of `<tool_call>` is held until the next text says. A call is known once `{"name": "...",
"arguments": ` is written with a tool's name; its arguments are then passed on character for
character up to the end of their JSON value (a string value whole, decoded, once closed). A block
of another shape (the arguments first, say) is read whole at its `</tool_call>`; one that names
no tool, or is no JSON, stays content, tags and all. After the first call of a request without
`parallel_tool_calls`, the rest is content.

Whitespace: where the output has calls, its content has no whitespace at its ends (between the
calls and text, it is kept); without calls the content is the text as written. tools.parse reads
a finished output through this same class, so a streamed answer's calls and content, put
together, are those of the same output unstreamed (`parse`).
"""

from __future__ import annotations

import json
import re

from .ids import unique_hex
from .tools import ToolPlan, call_of

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')

TEXT, HEAD, WHOLE, ARGS, TAIL, PLAIN = range(6)   # reading: text, a block's head, a block whole, arguments,
                                                  # the block's end, text that is no longer parsed


def new_id() -> str:
    return f"call_{unique_hex()}"


def _partial_open(text: str) -> int:
    """The length of the longest end of `text` that begins `<tool_call>`."""
    i = text.rfind("<", max(0, len(text) - len(OPEN) + 1))
    return len(text) - i if i >= 0 and OPEN.startswith(text[i:]) else 0


class ToolStream:
    """The calls of one output, found as it is written (the module's docstring)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.names, self.parallel = set(plan.names()), plan.parallel
        self.mode, self.buf = TEXT, ""   # buf: held text, or the block after "<tool_call>" read so far
        self.ws, self.said = "", False   # whitespace held back; whether content was given
        self.calls = 0
        self.at = self.depth = 0         # arguments: the next character to read, the JSON depth there
        self.quoted = self.escaped = False

    def push(self, text: str) -> list[tuple]:
        out: list[tuple] = []
        self.buf += text
        while self._step(out):
            pass
        return out

    def finish(self) -> list[tuple]:
        """What the output's end leaves: held text, an unclosed block as content (an unfinished
        call's arguments stay as written); the held whitespace where there is no call."""
        out: list[tuple] = []
        if self.mode in (TEXT, PLAIN):
            self._content(self.buf, out)
        elif self.mode in (HEAD, WHOLE):
            self._content(OPEN + self.buf, out)
        self.buf = ""
        if not self.calls and self.ws:
            out.append(("content", self.ws))
            self.ws = ""
        return out

    def _step(self, out: list) -> bool:
        """One move of the reader on `buf`; True when another may follow."""
        if self.mode == TEXT:
            i = self.buf.find(OPEN)
            if i < 0:
                keep = _partial_open(self.buf)
                self._content(self.buf[:len(self.buf) - keep], out)
                self.buf = self.buf[len(self.buf) - keep:]
                return False
            self._content(self.buf[:i], out)
            self.buf, self.mode = self.buf[i + len(OPEN):], HEAD
            return True
        if self.mode == PLAIN:
            self._content(self.buf, out)
            self.buf = ""
            return False
        if self.mode == HEAD:
            return self._head(out)
        if self.mode == ARGS:
            return self._args(out)
        i = self.buf.find(CLOSE)          # WHOLE or TAIL: until the block's end
        if i < 0:
            return False
        if self.mode == WHOLE:
            self._whole(self.buf[:i], out)
        self.buf = self.buf[i + len(CLOSE):]
        self.mode = PLAIN if self.calls and not self.parallel else TEXT
        return True

    def _head(self, out: list) -> bool:
        m = _HEAD.match(self.buf)
        if m is None or m.end() == len(self.buf):
            if CLOSE in self.buf:
                self.mode = WHOLE         # closed before a head of the usual shape
                return True
            return False
        try:
            name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            name = None
        if name not in self.names or self.buf[m.end()] not in '{["':
            self.mode = WHOLE
            return True
        out.append(("call", self.calls, new_id(), name))
        self.calls += 1
        self.buf, self.mode = self.buf[m.end():], ARGS
        self.at = self.depth = 0
        self.quoted = self.escaped = False
        return True

    def _args(self, out: list) -> bool:
        """The arguments' value from `at` on: passed on as read (a string once closed)."""
        buf, start, end = self.buf, self.at, -1
        for j in range(start, len(buf)):
            ch = buf[j]
            if self.quoted:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.quoted = False
                    if self.depth == 0:
                        end = j + 1
                        break
            elif ch == '"':
                self.quoted = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    end = j + 1
                    break
            elif ch == "<" and buf.startswith(CLOSE, j):  # the block ends inside the value: cut there
                end = j
                break
        stop = len(buf) if end < 0 else end
        index = self.calls - 1
        if buf[0] != '"':
            if stop > start:
                out.append(("args", index, buf[start:stop]))
        elif end >= 0:
            try:
                value = json.loads(buf[:end])
            except ValueError:
                value = buf[:end]
            if value:
                out.append(("args", index, value))
        self.at = stop
        if end < 0:
            return False
        self.buf, self.mode = buf[end:], TAIL
        return True

    def _whole(self, block: str, out: list) -> None:
        """A block read whole: a call if it is one to a tool, else content, tags and all."""
        call = call_of(block.strip(), self.names)
        if call is None:
            self._content(OPEN + block + CLOSE, out)
            return
        out.append(("call", self.calls, new_id(), call[0]))
        if call[1]:
            out.append(("args", self.calls, call[1]))
        self.calls += 1

    def _content(self, text: str, out: list) -> None:
        """Content, its whitespace at the end held back (and, after a call and before any
        content, dropped at its start)."""
        if not text:
            return
        held = self.ws + text
        body = held.rstrip()
        self.ws = held[len(body):]
        if self.calls and not self.said:
            body = body.lstrip()
        if body:
            out.append(("content", body))
            self.said = True


def parse(text: str, plan: ToolPlan) -> tuple[str | None, list[dict]]:
    """(content, None where the output has calls and no text; the calls in OpenAI's form: `id`,
    `type`, `function.name`, `function.arguments` as JSON text) of a finished output, as a stream
    of it gives them."""
    s = ToolStream(plan)
    content, calls = [], {}
    for d in s.push(text) + s.finish():
        if d[0] == "content":
            content.append(d[1])
        elif d[0] == "call":
            calls[d[1]] = {"id": d[2], "type": "function", "function": {"name": d[3], "arguments": ""}}
        else:
            calls[d[1]]["function"]["arguments"] += d[2]
    return ("".join(content) or None) if calls else "".join(content), [calls[k] for k in sorted(calls)]


def deltas(items: list[tuple]) -> list[dict]:
    """OpenAI's chat deltas of ToolStream's items: a call's first delta (index, id, type, name,
    arguments ""), then its arguments, a run of fragments as one; content as one where it runs on."""
    out: list[dict] = []
    for d in items:
        last = out[-1] if out else {}
        if d[0] == "content":
            if "content" in last:
                last["content"] += d[1]
            else:
                out.append({"content": d[1]})
        elif d[0] == "call":
            out.append({"tool_calls": [{"index": d[1], "id": d[2], "type": "function",
                                        "function": {"name": d[3], "arguments": ""}}]})
        elif "tool_calls" in last and "id" not in last["tool_calls"][0] and last["tool_calls"][0]["index"] == d[1]:
            last["tool_calls"][0]["function"]["arguments"] += d[2]
        else:
            out.append({"tool_calls": [{"index": d[1], "function": {"arguments": d[2]}}]})
    return out
