"""Application frameworks from PyPI against `serve --model tiny` (Splitwise 1P + 1T), each as its
users write it (issue 45): LangChain's `ChatOpenAI` (`bind_tools` with a named tool,
`with_structured_output` by function calling and by JSON schema), the OpenAI Agents SDK (an agent
whose one function tool it must call, on chat completions and on the Responses API, the SDK's
default) and pydantic-ai (a typed result, which it asks
for as a tool call). Each assertion is on the parsed objects the framework returns. The tools'
arguments are an enum and a boolean: the tiny model's weights are random, and a free integer or
string would run to max_tokens (the grammar keeps them valid, not short)."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from pydantic import BaseModel

pytest.importorskip("llguidance")


class Weather(BaseModel):
    city: Literal["Paris", "Lima"]
    metric: bool


def test_langchain_binds_a_tool_and_gets_structured_output(split_server):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: Literal["Paris", "Lima"], metric: bool) -> str:
        """The forecast."""
        return "sunny"

    llm = ChatOpenAI(base_url=split_server.url + "/v1", api_key=split_server.api_key, model="tiny",
                     temperature=1.0, max_tokens=120, seed=1, max_retries=0)
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"]
    assert Weather(**msg.tool_calls[0]["args"]) and msg.tool_calls[0]["id"].startswith("call_")
    assert get_weather.invoke(msg.tool_calls[0]).content == "sunny"       # the call runs the tool
    for method in ("function_calling", "json_schema"):
        got = llm.with_structured_output(Weather, method=method).invoke("Weather?")
        assert isinstance(got, Weather), (method, got)


@pytest.mark.parametrize("api", ["chat completions", "responses"])
def test_an_openai_agents_sdk_agent_calls_its_tool(split_server, api):
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls: list[tuple[str, bool]] = []

    @agents.function_tool
    def forecast(city: Literal["Paris", "Lima"], metric: bool) -> str:
        """The forecast."""
        calls.append((city, metric))
        return f"{city}: sunny"

    client = AsyncOpenAI(base_url=split_server.url + "/v1", api_key=split_server.api_key, max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client) if api == "chat completions" \
        else agents.OpenAIResponsesModel(model="tiny", openai_client=client)   # the SDK's default model
    agent = agents.Agent(name="weather", instructions="Use the tool.", tools=[forecast], model=model,
                         model_settings=agents.ModelSettings(tool_choice="required", max_tokens=120, temperature=1.0,
                                                             parallel_tool_calls=False),
                         tool_use_behavior="stop_on_first_tool")
    result = asyncio.run(agents.Runner.run(agent, "Weather?"))
    assert len(calls) == 1 and result.final_output == f"{calls[0][0]}: sunny"


def test_pydantic_ai_returns_a_typed_result(split_server):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=split_server.url + "/v1", api_key=split_server.api_key)
    agent = Agent(OpenAIChatModel("tiny", provider=provider), output_type=Weather,
                  model_settings={"max_tokens": 120, "temperature": 1.0, "seed": 2})
    result = agent.run_sync("Weather?")
    assert isinstance(result.output, Weather)
    assert any(p.part_kind == "tool-call" for m in result.all_messages() for p in getattr(m, "parts", []))
