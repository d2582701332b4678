"""Tool calls on chat completions, in the Hermes form many chat models are trained on (vLLM's
`--tool-call-parser hermes`): the model writes each call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`ToolPlan` is what a request asked (its `tools`, `tool_choice`, `parallel_tool_calls`); `grammar`
makes the llguidance grammar that forces a call (`tool_choice` "required", or a named function:
the call's name one of the tools', its arguments their JSON schema), so that even a small model
returns valid arguments; "auto" leaves the model free and tool_stream.py finds the calls it
writes, as it writes them (`parse` there reads a whole output); "none" offers the tools to the
template but parses nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"


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


def call_of(block: str, names: set[str]) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of one block's call, None unless it is JSON naming one of the
    tools."""
    try:
        v = json.loads(block)
    except ValueError:
        return None
    if not isinstance(v, dict) or v.get("name") not in names:
        return None
    args = v.get("arguments", v.get("parameters", {}))
    return v["name"], args if isinstance(args, str) else json.dumps(args)


def rendered_call(call: dict) -> str:
    """An assistant message's earlier call as the model would have written it (chat templates)."""
    f = call.get("function") or {}
    args = f.get("arguments") or "{}"
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        pass
    return OPEN + json.dumps({"name": f.get("name"), "arguments": args}) + CLOSE
