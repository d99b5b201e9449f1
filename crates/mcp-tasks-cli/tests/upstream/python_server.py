"""A small upstream MCP server for the gateway's integration tests and docs/GATEWAY.md's walkthrough.

An ordinary (task-less) MCP server written with the official MCP Python SDK 1.x (FastMCP),
which `mcp-tasks serve --upstream URL` / `--upstream-command 'CMD ARGS'` puts durable tasks
in front of. scripts/upstreams.sh installs the SDK into a virtualenv
($HOME/.cache/mcp-tasks-upstreams/venv by default).

usage: python_server.py http PORT   Streamable HTTP at http://127.0.0.1:PORT/mcp (stateful
                                    sessions, Mcp-Session-Id, SSE responses: the SDK's defaults)
       python_server.py stdio       newline-delimited JSON-RPC on stdin/stdout

Tools:
  slow(seconds=2, steps=4)  sleeps seconds/steps per step with a progress notification after
                            each one (when the call has a progressToken; over HTTP the SDK
                            sends them on the session's GET stream, not on the tools/call POST's
                            SSE response); returns the text
                            "slept {seconds:g}s in {steps} steps". Not idempotent. If the env var
                            SIDE_EFFECTS names a file, appends "slow start ID" when it begins and
                            "slow end ID" when it ends, so a test can count the runs.
  ask(question)             asks the client for a name (elicitation/create, a form with one
                            string field `name`); returns "hello NAME", "declined" or "cancelled".
  echo(message)             returns the message as text content and as structured content
                            {"result": message} (with the matching outputSchema).
  fail()                    always fails: a result with isError true and the text
                            "Error executing tool fail: this tool always fails".
"""

import asyncio
import os
import sys
import uuid
import warnings

from pydantic import BaseModel

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

# pydantic-settings' warning about the SDK's own Settings model: noise, not ours.
warnings.filterwarnings("ignore", message="Field 'lifespan' has an incomplete definition")
mcp = FastMCP("mcp-tasks-test-upstream", log_level="WARNING")


def side_effect(line: str) -> None:
    path = os.environ.get("SIDE_EFFECTS")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()


@mcp.tool(annotations=ToolAnnotations(idempotentHint=False), structured_output=False)
async def slow(ctx: Context, seconds: float = 2, steps: int = 4) -> str:
    """Sleeps `seconds` in `steps` steps, reporting progress after each step."""
    run = uuid.uuid4().hex
    side_effect(f"slow start {run}")
    for i in range(1, steps + 1):
        await asyncio.sleep(seconds / steps)
        await ctx.report_progress(i, steps, message=f"step {i}/{steps}")
    side_effect(f"slow end {run}")
    return f"slept {seconds:g}s in {steps} steps"


class Name(BaseModel):
    name: str


@mcp.tool(structured_output=False)
async def ask(ctx: Context, question: str = "What is your name?") -> str:
    """Asks the user for their name (elicitation) and greets them."""
    answer = await ctx.elicit(message=question, schema=Name)
    if answer.action == "accept":
        return f"hello {answer.data.name}"
    return "declined" if answer.action == "decline" else "cancelled"


@mcp.tool()
def echo(message: str) -> str:
    """Returns the message (as text, and as structured content {"result": message})."""
    return message


@mcp.tool(structured_output=False)
def fail() -> str:
    """Always fails with a tool error."""
    raise RuntimeError("this tool always fails")


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"] and len(sys.argv) == 3:
        mcp.settings.port = int(sys.argv[2])
        mcp.run(transport="streamable-http")
    elif sys.argv[1:] == ["stdio"]:
        mcp.run(transport="stdio")
    else:
        sys.exit("usage: python_server.py http PORT | python_server.py stdio")
