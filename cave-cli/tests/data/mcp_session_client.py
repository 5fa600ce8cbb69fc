"""Drives `cave mcp serve` with the official Python MCP client, as the tests' plan says.

The plan (JSON, first argument): {"server": {"command": [...]} or {"url": ..., "token": ...},
"mode": "auto" | "legacy", "elicit": null or a list of answers ("accept", "decline"), one per
question, "calls": [{"tool": ..., "arguments": {...}}, ...]}. Prints one JSON object: the
protocol version, the instructions, the tool names, each call's result and the questions asked.
"""

import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
import mcp_types as types


async def main(plan):
    asked = []
    answers = list(plan.get("elicit") or [])

    async def elicit(context, params):
        asked.append(params.message)
        action = answers.pop(0) if answers else "decline"
        return types.ElicitResult(action=action, content={} if action == "accept" else None)

    server = plan["server"]
    if "command" in server:
        # The whole environment (the SDK passes only a few variables by default): the
        # interpreter the tests chose.
        target = StdioServerParameters(
            command=server["command"][0], args=server["command"][1:], env=dict(os.environ)
        )
    else:
        import httpx2

        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {server['token']}"}, timeout=60)
        target = streamable_http_client(server["url"], http_client=http)
    options = {"mode": plan.get("mode", "auto"), "read_timeout_seconds": 120}
    if plan.get("elicit") is not None:
        options["elicitation_callback"] = elicit
    report = {"results": [], "asked": asked}
    async with Client(target, **options) as client:
        report["protocol_version"] = client.protocol_version
        report["instructions"] = client.instructions
        report["tools"] = sorted(tool.name for tool in (await client.list_tools()).tools)
        for call in plan["calls"]:
            result = await client.call_tool(call["tool"], call.get("arguments", {}))
            texts = [c.text for c in result.content if c.type == "text"]
            images = [c.mime_type for c in result.content if c.type == "image"]
            report["results"].append(
                {
                    "is_error": bool(result.is_error),
                    "text": "\n".join(texts),
                    "images": images,
                    "structured": result.structured_content,
                }
            )
    print(json.dumps(report))


asyncio.run(main(json.loads(sys.argv[1])))
