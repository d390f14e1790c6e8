"""ipybox as a native code-action tool of agent frameworks.

One module per framework, each imported on its own and needing its extra:

- `ipybox.integrations.langchain` (``pip install "ipybox[langchain]"``): LangChain / LangGraph;
- `ipybox.integrations.pydantic_ai` (``pip install "ipybox[pydantic-ai]"``): PydanticAI;
- `ipybox.integrations.openai_agents` (``pip install "ipybox[openai-agents]"``): the OpenAI Agents SDK.

Each turns the MCP tool calls made by the running code into that framework's own human-in-the-loop
approvals. Importing this package imports no framework.
"""

__all__ = ()
