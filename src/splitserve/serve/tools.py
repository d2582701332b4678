"""Tool calls on chat completions, in the Hermes form many chat models are trained on (vLLM's
`--tool-call-parser hermes`): the model writes each call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`ToolPlan` is what a request asked (its `tools`, `tool_choice`, `parallel_tool_calls`); `grammar`
makes the llguidance grammar that forces a call (`tool_choice` "required", or a named function:
the call's name one of the tools', its arguments their JSON schema), so that even a small model
returns valid arguments; "auto" leaves the model free and `parse` finds the calls it wrote;
"none" offers the tools to the template but parses nothing. `parse` returns the text around the
calls and the calls in OpenAI's form (`id`, `type`, `function.name`, `function.arguments` as JSON
text); a block that is not a call to one of the tools stays text.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_ids = random.Random()  # call ids: unique, not secret


@dataclass(frozen=True, slots=True)
class ToolPlan:
    tools: tuple[dict, ...]    # each {"name", "description"?, "parameters"?}: OpenAI's `function` objects
    choice: str                # "none", "auto", "required", or the name of the function to call
    parallel: bool = True      # more than one call allowed

    @property
    def forced(self) -> bool:
        """Whether the output must be tool calls (a grammar makes it so)."""
        return self.choice not in ("none", "auto")

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    def names(self) -> list[str]:
        return [t["name"] for t in self.tools]


def grammar(plan: ToolPlan) -> str:
    """A Lark grammar (llguidance's dialect) of the output `plan` forces: one call (more, newline
    apart, where parallel calls are allowed to a request that does not name its function), each a
    tool's name and arguments following the tool's parameters schema, compact JSON."""
    tools = [t for t in plan.tools if plan.choice in ("required", t["name"])]
    rules = [f'call: {json.dumps(OPEN)} ({" | ".join(f"fn_{i}" for i in range(len(tools)))}) {json.dumps(CLOSE)}']
    for i, t in enumerate(tools):
        head = json.dumps('{"name": ' + json.dumps(t["name"]) + ', "arguments": ')
        schema = {**(t.get("parameters") or {"type": "object"}), "x-guidance": {"whitespace_flexible": False}}
        rules += [f'fn_{i}: {head} args_{i} "}}"', f"args_{i}: %json {json.dumps(schema)}"]
    start = 'start: call ("\\n" call)*' if plan.parallel and plan.choice == "required" else "start: call"
    return "\n".join([start, *rules])


def parse(text: str, plan: ToolPlan) -> tuple[str | None, list[dict]]:
    """(the text around the calls, None where there is none; the calls) of a finished output."""
    calls, kept, at = [], [], 0
    names = set(plan.names())
    for m in _BLOCK.finditer(text):
        call = _call(m.group(1), names)
        if call is None:
            continue
        kept.append(text[at:m.start()])
        at = m.end()
        calls.append(call)
        if not plan.parallel:
            break
    kept.append(text[at:])
    rest = "".join(kept).strip()
    return (rest or None) if calls else text, calls


def _call(block: str, names: set[str]) -> dict | None:
    """A tool call in OpenAI's form of one block's JSON, None unless it names one of the tools."""
    try:
        v = json.loads(block)
    except ValueError:
        return None
    if not isinstance(v, dict) or v.get("name") not in names:
        return None
    args = v.get("arguments", v.get("parameters", {}))
    return {"id": f"call_{_ids.getrandbits(96):024x}", "type": "function",
            "function": {"name": v["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def rendered_call(call: dict) -> str:
    """An assistant message's earlier call as the model would have written it (chat templates)."""
    f = call.get("function") or {}
    args = f.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        pass
    return OPEN + json.dumps({"name": f.get("name"), "arguments": args}) + CLOSE
