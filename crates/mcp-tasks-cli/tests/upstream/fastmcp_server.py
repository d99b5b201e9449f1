"""A FastMCP 4.x server for the gateway's tests: the two ways a FastMCP tool asks for input.

- `deploy`: works in steps with progress, then asks with `ctx.elicit()` half-way (imperative
  elicitation: a `2025-11-25` session's server-initiated request; FastMCP refuses it on a
  stateless `2026-07-28` call).
- `deploy_guard`: the same work, asking with the `2026-07-28` guard pattern: it returns an
  `InputRequiredResult` and reads `ctx.input_responses` when called again.
- `slow`: steps with progress and nothing else.

Every round and step is appended to the file named by $SIDE_EFFECTS, so a test can count how
often each part ran.

usage: python fastmcp_server.py http PORT
"""

import asyncio
import os
import sys

from fastmcp import Context, FastMCP
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult

mcp = FastMCP("fastmcp-fixture")


def note(line: str) -> None:
    path = os.environ.get("SIDE_EFFECTS")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


async def work(ctx: Context, name: str, first: int, last: int, steps: int, seconds: float) -> None:
    for step in range(first, last + 1):
        await ctx.report_progress(step, steps, f"step {step}/{steps} of {name}")
        note(f"{name} step={step}")
        await asyncio.sleep(seconds / steps)


@mcp.tool
async def deploy(target: str, ctx: Context, seconds: float = 1.0, steps: int = 4) -> str:
    """Deploys `target`, asking for confirmation half-way (ctx.elicit)."""
    note("deploy start")
    half = steps // 2
    await work(ctx, "deploy", 1, half, steps, seconds)
    answer = await ctx.elicit(f"Deploy {target}?", response_type=bool)
    if answer.action != "accept" or not answer.data:
        note("deploy declined")
        return f"{target}: not deployed"
    await work(ctx, "deploy", half + 1, steps, steps, seconds)
    note("deploy done")
    return f"{target}: deployed"


@mcp.tool
async def deploy_guard(target: str, ctx: Context, seconds: float = 1.0, steps: int = 4):
    """Deploys `target`, asking for confirmation half-way (the guard pattern)."""
    half = steps // 2
    responses = ctx.input_responses
    if not responses or "confirm" not in responses:
        note("guard round=1")
        await work(ctx, "deploy_guard", 1, half, steps, seconds)
        return InputRequiredResult(
            result_type="input_required",
            input_requests={
                "confirm": ElicitRequest(
                    method="elicitation/create",
                    params=ElicitRequestFormParams(
                        message=f"Deploy {target}?",
                        requested_schema={
                            "type": "object",
                            "properties": {"value": {"type": "boolean"}},
                            "required": ["value"],
                        },
                    ),
                )
            },
            request_state=f"half:{target}",
        )
    note("guard round=2")
    if ctx.request_state != f"half:{target}":
        raise ValueError(f"unexpected requestState {ctx.request_state!r}")
    answer = responses["confirm"]
    content = getattr(answer, "content", None) or {}
    if getattr(answer, "action", None) != "accept" or not content.get("value"):
        return f"{target}: not deployed"
    await work(ctx, "deploy_guard", half + 1, steps, steps, seconds)
    note("guard done")
    return f"{target}: deployed"


@mcp.tool
async def slow(ctx: Context, seconds: float = 1.0, steps: int = 4) -> str:
    """Works for `seconds` in `steps`, reporting progress at each."""
    await work(ctx, "slow", 1, steps, steps, seconds)
    return "slow: done"


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "http":
        sys.exit("usage: fastmcp_server.py http PORT")
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[2]), show_banner=False)
