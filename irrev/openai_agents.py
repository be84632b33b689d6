"""irrev for the OpenAI Agents SDK (`pip install 'irrev[openai-agents]'`): an HTTP
tool behind the gateway as the SDK's function tool. The tool-call id the SDK hands
every invocation (`ToolContext.tool_call_id`) becomes the effect's Idempotency-Key
(irrev/client.py), so a run that invokes one tool call again (a retry, a resumed
run) makes its effect once; the model reads the tool's answer, or a sentence saying
why there is none."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from .client import BodyFormat, IrrevClient, body_of
from .extras import missing_extra

try:
    from agents import FunctionTool
    from agents.strict_schema import ensure_strict_json_schema
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:
    raise missing_extra(__name__, "openai-agents", exc) from exc


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
) -> FunctionTool:
    """A function tool that sends its arguments (checked against `args_schema`) as the
    body of `method path` to the gateway's tool `tool`: JSON, or a form (`body="form"`,
    for a route whose `body_format` is `form`). It returns the text for the model."""

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        try:
            parsed = args_schema.model_validate_json(arguments or "{}")
        except ValidationError as exc:
            # The model's to fix: nothing was sent.
            return f"The {name} call was not made: its arguments do not fit ({exc})."
        given = parsed.model_dump(mode="json", exclude_unset=True)
        outcome = await client.call(
            tool, method, path, context.tool_call_id, **body_of(given, body)
        )
        return outcome.text

    return FunctionTool(
        name=name,
        description=description,
        params_json_schema=ensure_strict_json_schema(args_schema.model_json_schema()),
        on_invoke_tool=invoke,
    )
