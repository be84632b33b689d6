"""irrev for LangChain agents (`pip install 'irrev[langchain]'`): an HTTP tool behind
the gateway as a LangChain tool. The tool-call id LangChain injects becomes the
effect's Idempotency-Key (irrev/client.py), so a graph that re-runs a tool call
does not repeat its effect; what the model reads is the tool's answer, or a sentence
saying why there is none (refused, waiting for a human, outcome unknown)."""

from __future__ import annotations

from typing import Annotated, Any

from .client import BodyFormat, IrrevClient, Outcome, body_of
from .extras import missing_extra

try:
    from langchain_core.tools import InjectedToolCallId, StructuredTool
except ModuleNotFoundError as exc:
    raise missing_extra(__name__, "langchain", exc) from exc
from pydantic import BaseModel, create_model


def http_tool(
    client: IrrevClient,
    *,
    name: str,
    description: str,
    tool: str,
    method: str,
    path: str,
    args_schema: type[BaseModel],
    body: BodyFormat = "json",
) -> StructuredTool:
    """A LangChain tool that sends its arguments as the body of `method path` to the
    gateway's tool `tool`: JSON, or a form (`body="form"`, for a route whose
    `body_format` is `form`). Its result is the text for the model and, as the
    message's artifact, the `Outcome` (reason code, escalation, replayed, figures)
    for the program."""
    schema = create_model(
        f"{args_schema.__name__}WithCallId",
        __base__=args_schema,
        tool_call_id=(Annotated[str, InjectedToolCallId], ...),
    )

    async def run(tool_call_id: str, **arguments: Any) -> tuple[str, Outcome]:
        outcome = await client.call(tool, method, path, tool_call_id, **body_of(arguments, body))
        return outcome.text, outcome

    return StructuredTool.from_function(
        coroutine=run,
        name=name,
        description=description,
        args_schema=schema,
        response_format="content_and_artifact",
    )
