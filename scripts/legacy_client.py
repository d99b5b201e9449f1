"""A real 2025-11-25 client against `mcp-tasks serve --fixtures conformance`.

The official MCP Python SDK (a release that predates 2026-07-28; scripts/legacy-client.sh
installs it) opens a session with `initialize`, calls a synchronous tool, runs a tool as an
experimental task to completion (poll with tasks/get, result with tasks/result), runs a task
that asks for input (the elicitation arrives as a server-to-client request and the SDK's
callback answers it), lists its tasks and cancels one. Any mismatch raises; the exit status
says whether everything held.

usage: python legacy_client.py URL
"""

import asyncio
import sys

import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


def text_of(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)
    print(f"ok: {what}")


async def answer_elicitation(context, params: types.ElicitRequestParams) -> types.ElicitResult:
    print(f"elicitation asked: {params.message}")
    return types.ElicitResult(action="accept", content={"confirm": True})


async def wait_for(session: ClientSession, task_id: str, statuses: set[str]) -> str:
    for _ in range(600):
        status = (await session.experimental.get_task(task_id)).status
        if status in statuses:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {statuses}")


async def main(url: str) -> None:
    async with streamablehttp_client(url) as (read, write, get_session_id):
        async with ClientSession(read, write, elicitation_callback=answer_elicitation) as session:
            init = await session.initialize()
            check(init.protocolVersion == "2025-11-25", f"negotiated {init.protocolVersion}")
            check(init.capabilities.tasks is not None, "the server declares tasks")
            check(get_session_id() is not None, "the server issued a session id")

            tools = (await session.list_tools()).tools
            by_name = {t.name: t for t in tools}
            check("slow_compute" in by_name, f"{len(tools)} tools listed")
            execution = by_name["slow_compute"].execution
            check(execution is not None and execution.taskSupport == "optional",
                  "slow_compute may run as a task")

            greeting = await session.call_tool("greet", {"name": "legacy client"})
            check(text_of(greeting) == "Hello, legacy client!", f"sync call: {text_of(greeting)}")

            created = await session.experimental.call_tool_as_task(
                "slow_compute", {"seconds": 1, "label": "python"}, ttl=120000)
            task_id = created.task.taskId
            check(created.task.status == "working", f"task {task_id} created working")
            statuses = []
            async for status in session.experimental.poll_task(task_id):
                statuses.append(status.status)
            check(statuses[-1] == "completed", f"polled {statuses[0]} .. {statuses[-1]}")
            result = await session.experimental.get_task_result(task_id, types.CallToolResult)
            check("python" in text_of(result), f"task result: {text_of(result)}")

            asking = await session.experimental.call_tool_as_task(
                "confirm_delete", {"filename": "notes.txt"})
            asking_id = asking.task.taskId
            # The elicitation arrives as a server-to-client request on the session's GET stream
            # (or on the tasks/result stream below, had the GET stream not been open); the
            # callback's answer resumes the task.
            reached = await wait_for(session, asking_id, {"input_required", "completed"})
            check(reached in ("input_required", "completed"), f"the asking task is {reached}")
            answered = await session.experimental.get_task_result(asking_id, types.CallToolResult)
            check(text_of(answered) == "Deleted notes.txt.", f"answered task: {text_of(answered)}")

            long = await session.experimental.call_tool_as_task("slow_compute", {"seconds": 60})
            listed = {t.taskId for t in (await session.experimental.list_tasks()).tasks}
            check({task_id, asking_id, long.task.taskId} <= listed, f"{len(listed)} tasks listed")
            cancelled = await session.experimental.cancel_task(long.task.taskId)
            check(cancelled.status == "cancelled", "a running task cancelled")
    print("legacy client: all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
