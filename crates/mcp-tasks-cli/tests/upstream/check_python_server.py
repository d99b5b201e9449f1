"""Checks python_server.py with the MCP Python SDK's own client, over Streamable HTTP and stdio.

Starts the server itself (on a free port for HTTP), calls all four tools and checks the
results, the progress notifications, the elicitation round trip and the SIDE_EFFECTS lines.
Run it with the Python of the virtualenv that scripts/upstreams.sh installs.

usage: check_python_server.py      (exits non-zero with a message if a check fails)
"""

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.types import ElicitResult, TextContent

SERVER = str(Path(__file__).with_name("python_server.py"))


def text(result) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


async def exercise(read, write, transport: str, side_effects: Path) -> None:
    def check(cond: bool, what: str) -> None:
        if not cond:
            raise SystemExit(f"FAIL ({transport}): {what}")

    asked = []  # the elicitation requests; the 1st is accepted, the 2nd declined, the 3rd cancelled

    async def on_elicit(context, params):
        asked.append(params)
        action = ["accept", "decline", "cancel"][len(asked) - 1]
        return ElicitResult(action=action, content={"name": "Ada"} if action == "accept" else None)

    progress = []

    async def on_progress(value, total, message):
        progress.append((value, total, message))

    async with ClientSession(read, write, elicitation_callback=on_elicit) as session:
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        check(sorted(tools) == ["ask", "echo", "fail", "slow"], f"tools {sorted(tools)}")
        check(tools["slow"].annotations.idempotentHint is False, "slow is annotated idempotentHint false")

        result = await session.call_tool("slow", {"seconds": 0.4, "steps": 2}, progress_callback=on_progress)
        check(text(result) == "slept 0.4s in 2 steps" and not result.isError, f"slow: {result}")
        await asyncio.sleep(0.1)  # over HTTP the progress comes on the GET stream, apart from the result
        check(progress == [(1, 2, "step 1/2"), (2, 2, "step 2/2")], f"slow progress {progress}")
        words = side_effects.read_text().split()
        check(words[0:2] == ["slow", "start"] and words[3:5] == ["slow", "end"], f"side effects {words}")
        check(len(words) == 6 and words[2] == words[5], f"one run, one id: {words}")

        for expected in ["hello Ada", "declined", "cancelled"]:
            result = await session.call_tool("ask", {"question": "Who are you?"})
            check(text(result) == expected, f"ask: {result}")
        check(asked[0].message == "Who are you?", f"elicitation {asked[0]}")
        check(list(asked[0].requestedSchema["properties"]) == ["name"], f"elicitation {asked[0]}")

        result = await session.call_tool("echo", {"message": "hi"})
        check(text(result) == "hi" and result.structuredContent == {"result": "hi"}, f"echo: {result}")

        result = await session.call_tool("fail", {})
        check(result.isError is True and "always fails" in text(result), f"fail: {result}")
    print(f"python_server.py over {transport}: slow, ask, echo, fail ok")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def over_http(side_effects: Path) -> None:
    port = free_port()
    env = dict(os.environ, SIDE_EFFECTS=str(side_effects))
    log = side_effects.with_suffix(".stderr")
    with open(log, "w") as stderr:
        server = subprocess.Popen([sys.executable, SERVER, "http", str(port)], env=env, stderr=stderr)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("FAIL (http): the server did not start")
                await asyncio.sleep(0.05)
        async with streamablehttp_client(f"http://127.0.0.1:{port}/mcp") as (read, write, _):
            await exercise(read, write, "http", side_effects)
    except BaseException:
        print(f"the HTTP server's stderr:\n{log.read_text()}", file=sys.stderr)
        raise
    finally:
        server.terminate()
        server.wait(5)


async def over_stdio(side_effects: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[SERVER, "stdio"], env=dict(os.environ, SIDE_EFFECTS=str(side_effects))
    )
    async with stdio_client(params) as (read, write):
        await exercise(read, write, "stdio", side_effects)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await asyncio.gather(over_http(Path(tmp, "http.log")), over_stdio(Path(tmp, "stdio.log")))


if __name__ == "__main__":
    asyncio.run(main())
