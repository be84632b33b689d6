"""README's MCP section as a user copies it: the generic client's config connects to
`irrev serve` (its URL's origin and the token are the only things one fills in) and
lists the agent's tools; the policy snippet is a route of examples/mcp-fleet.yaml, and
the stdio server's snippet a valid server of it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gateway.settings import GatewaySettings
from pricing import load_policy_data
from tests.gateway.servers import ROOT

from .conftest import McpGateway, agent

README = ROOT / "README.md"


def mcp_section() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("### MCP tools", 1)[1].split("\n### ", 1)[0]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", mcp_section(), flags=re.DOTALL)


@pytest.mark.asyncio(loop_scope="session")
async def test_the_readme_client_config_connects_as_written(mcp_gateway: McpGateway) -> None:
    (config,) = [json.loads(block) for block in blocks("json")]
    server: dict[str, Any] = config["mcpServers"]["irrev"]
    assert server["type"] == "http"
    # Where `irrev serve` listens unless told otherwise.
    default = f"http://127.0.0.1:{GatewaySettings.model_fields['port'].default}"
    assert server["url"].startswith(f"{default}/"), server["url"]
    url = server["url"].replace(default, mcp_gateway.url)
    assert url == f"{mcp_gateway.url}/mcp"
    tenant = mcp_gateway.tenant("basics")
    headers = {
        name: value.replace("irrev_...", tenant.tokens["dev-01"])
        for name, value in server["headers"].items()
    }
    assert headers == tenant.auth("dev-01")
    async with agent(url.removesuffix("/mcp"), headers) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert names == {"github__delete_repository"}


def test_the_readme_policy_snippets_are_the_examples() -> None:
    snippet, stdio = [yaml.safe_load(block) for block in blocks("yaml")]
    example = yaml.safe_load((ROOT / "examples" / "mcp-fleet.yaml").read_text())
    for name, tool in snippet["tools"].items():
        assert example["tools"][name] == tool
    for route in snippet["routes"]:
        assert route in example["routes"]
    # The stdio form of the example's server is a valid policy in its place.
    example["tools"].update(stdio["tools"])
    assert load_policy_data(example, "README").document.tools["github"].mcp_command
