"""An MCP server for cave-mcp's tests, on the official Python SDK: each tool is one case a
client must handle (structured and text results, an error result, a slow tool, one that never
answers, a server that dies mid-call, a name that is not an identifier, a tool list that changes)."""

import os
import sys
import time

import anyio

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("cave-edge")


@server.tool()
def add(a: int, b: int = 2) -> int:
    """Adds two integers."""
    return a + b


@server.tool(name="word-stats", structured_output=False)
def word_stats(text: str) -> str:
    """Counts the words of a text (answers in text)."""
    return f"{len(text.split())} words"


class Profile(BaseModel):
    name: str
    tags: list[str]
    ok: bool


@server.tool()
def profile(name: str, tags: list[str] | None = None) -> Profile:
    """A structured record."""
    return Profile(name=name, tags=tags or [], ok=True)


@server.tool(structured_output=False)
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(f"refused: {reason}")


@server.tool(structured_output=False)
def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    time.sleep(seconds)
    return "woke"


CANCELLED = {"hang": 0}


@server.tool(structured_output=False)
async def hang() -> str:
    """Never answers; counts the requests the client cancelled (`notifications/cancelled`)."""
    try:
        await anyio.sleep(3600)
    except anyio.get_cancelled_exc_class():
        CANCELLED["hang"] += 1
        raise
    return "woke"


@server.tool(structured_output=False)
def cancelled() -> str:
    """How many calls of `hang` the client cancelled."""
    return str(CANCELLED["hang"])


@server.tool(structured_output=False)
def die() -> str:
    """Ends the server's process in the middle of the call."""
    print("edge server: dying on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool(structured_output=False)
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool(structured_output=False)
async def grow(ctx: Context) -> str:
    """Adds a tool named `extra` and says the tool list changed."""

    def extra() -> str:
        """A tool that was not there at first."""
        return "extra here"

    server.add_tool(extra, structured_output=False)
    await ctx.session.send_tool_list_changed()
    return "grown"


def serve_http(port: int, token: str | None) -> None:
    """Streamable HTTP on 127.0.0.1, refusing requests without `Authorization: Bearer TOKEN`."""
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and token is not None:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if given != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"wrong or missing token"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    if os.environ.get("EDGE_FAIL_AT_START"):
        print("edge server: missing configuration EDGE_TOKEN", file=sys.stderr, flush=True)
        sys.exit(2)
    if os.environ.get("EDGE_HTTP_PORT"):
        serve_http(int(os.environ["EDGE_HTTP_PORT"]), os.environ.get("EDGE_TOKEN"))
    else:
        server.run()
