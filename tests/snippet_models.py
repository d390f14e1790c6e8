"""Each framework's own test model, put in place of the hosted model a documentation snippet names
(its `MODEL = ...` line) by tests/test_snippets.py: each writes one code action that calls the
weather example's tool, then answers "done"."""

from __future__ import annotations

from typing import Any

CODE = 'from mcptools.weather import get_forecast\nprint(get_forecast.run({"city": "oslo"}).temperature)'
ANSWER = "done (test model)"


def langchain_model() -> Any:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    class Scripted(FakeMessagesListChatModel):
        # create_agent binds the tools, which a scripted model has no use for.
        def bind_tools(self, tools: Any, **kwargs: Any) -> Scripted:
            return self

    call = {"name": "execute_code", "args": {"code": CODE}, "id": "call-1", "type": "tool_call"}
    return Scripted(responses=[AIMessage("", tool_calls=[call]), AIMessage(ANSWER)])


def pydantic_ai_model() -> Any:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) and m.tool_calls for m in messages):
            return ModelResponse(parts=[ToolCallPart("execute_code", {"code": CODE}, tool_call_id="call-1")])
        return ModelResponse(parts=[TextPart(ANSWER)])

    return FunctionModel(respond)


def openai_agents_model() -> Any:
    from agents import set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    set_tracing_disabled(True)  # offline: nowhere to send traces
    return ScriptedModel(
        [[function_call("execute_code", {"code": CODE}, call_id="call-1")], [assistant_message(ANSWER)]]
    )
