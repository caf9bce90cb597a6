"""`marque mcp` driven by the MCP SDK's own client, over stdio and streamable HTTP, through a
real `harbour serve` and a real, joined `pilot serve` (docs/agents.md).

One world for the module: a Harbourmaster with docs/agents.md's routing (reads allowed;
changes delegated to one approver, the agent's capped at 5 rows and one execution); a Pilot
serving the SQLite bank; the agent `claude` (role agent, its own key), added with `marque
harbour principal add`; a human approver `bob`; one `marque mcp --http` most tests share.
Each test asks under request ids of its own. Covered: an agent's read (over stdio) and a
repeated one; a write that waits for a human, approved with `marque approve`, executed by
the agent, and a retried `execute` — in the same server and another — answered from the
ledger (the rows changed once); an ended request's `execute` answered from its reports;
every way the agent might approve — the HTTP API, the CLI, the console with its token —
refused by the Harbourmaster; a request over the routing's budget cap denied; errors as
tool errors with their code and next step; a server that will not start as a human; the
documented client config and transcript.
"""

from __future__ import annotations

import json
import re
import select
import sqlite3
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from e2e_support import run_cli
from mcp import Client, StdioServerParameters
from support.harbour import (
    DEBIT,
    MARQUE,
    READ,
    TIMEOUT,
    TOPUP_DECLARATION,
    HarbourWorld,
    cli_env,
    cli_json,
    effect_body,
    request_body,
    wait_for_request,
)

AGENT = "claude"
#: Seconds `marque mcp --http` may take to listen (a loaded machine imports slowly).
START_SECONDS = 60
AGENTS_DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def doc_block(marker: str) -> str:
    """The fenced block right after ``<!-- marker -->`` in docs/agents.md."""
    text = AGENTS_DOC.read_text()
    found = re.search(r"<!-- " + re.escape(marker) + r" -->\n```\w*\n(.*?)\n```", text,
                      re.DOTALL)
    assert found, f"docs/agents.md has no block marked {marker!r}"
    return found.group(1)


#: The routing docs/agents.md shows: reads allowed (at most 1000 rows); writes, DDL and
#: anything else delegated to one approver, the agent's at most 5 rows and one execution.
ROUTING = doc_block("agent routing")


class AgentWorld:
    """The module's world: a joined bank, the agent and its key, the routing above."""

    def __init__(self, root: Path) -> None:
        from marque.cli.common import write_private
        from marque.token import new_key, public_jwk

        self.joined = HarbourWorld(root, serve=True)
        self.harbour = self.joined.harbour
        self.server = self.joined.server
        self.key = root / "agent.jwk"
        self.pub = root / "agent.pub.jwk"
        agent_key = new_key()
        write_private(self.key, agent_key)
        self.pub.write_text(json.dumps(public_jwk(agent_key)))
        self.harbour.set_routing(ROUTING)
        # The command an operator runs (its refusals: test_agent_principals_are_added_alone).
        added = cli_json("harbour", "principal", "add", "--home", self.harbour.home, AGENT,
                         "--role", "agent", "--key", self.pub)
        assert added["roles"] == ["agent"] and added["key_thumbprint"]
        self.token: str = added["token"]
        self.token_file = root / "agent.token"
        self.token_file.write_text(self.token + "\n")
        self.bob = self.joined.bob
        self.http = HttpMcp(self)

    def mcp_args(self, *extra: str) -> list[str]:
        return ["mcp", "--harbour", self.server.url, "--token-file", str(self.token_file),
                "--key", str(self.key), "--pilot-id", "p1", "--target", "bank", *extra]

    def stdio(self) -> Client:
        """An SDK client that starts `marque mcp` on stdio."""
        return Client(StdioServerParameters(command=str(MARQUE), args=self.mcp_args(),
                                            env=cli_env()), read_timeout_seconds=60)

    def human(self, token: str, *args: Any) -> Any:
        env = cli_env({"MARQUE_HARBOUR": self.server.url, "MARQUE_TOKEN": token})
        return run_cli(*args, env=env)

    def client(self) -> Client:
        """An SDK client of the module's `marque mcp --http` (cheaper than a process each)."""
        return Client(self.http.url, read_timeout_seconds=60)

    def stop(self) -> None:
        self.http.stop()
        self.joined.stop()


class HttpMcp:
    """`marque mcp --http 127.0.0.1:0` as a process; its URL from its ready line."""

    def __init__(self, world: AgentWorld) -> None:
        # Its stderr goes to a file (a pipe nobody reads could fill and stop it).
        self.log = world.key.parent / "mcp-http.log"
        with self.log.open("w") as stderr:
            self.proc = subprocess.Popen(
                [str(MARQUE), *world.mcp_args("--http", "127.0.0.1:0", "--json")],
                stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                text=True, env=cli_env())
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_SECONDS)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise AssertionError(f"marque mcp --http printed no ready line within "
                                 f"{START_SECONDS} s: {self.log.read_text()[-2000:]}")
        self.ready = json.loads(line)
        self.url: str = self.ready["url"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentWorld]:
    running = AgentWorld(tmp_path_factory.mktemp("agents"))
    try:
        yield running
    finally:
        running.stop()


def session(client: Client, body: Callable[[Client], Awaitable[Any]]) -> Any:
    """Run ``body(client)`` inside one connected MCP session; its result."""
    async def go() -> Any:
        async with client as connected:
            return await body(connected)

    return anyio.run(go)


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """Call a tool: (is_error, its structured answer), checked against its JSON text."""
    result = await client.call_tool(tool, arguments)
    body = result.structured_content
    assert isinstance(body, dict), result
    assert json.loads(result.content[0].text) == body  # type: ignore[union-attr]
    return result.is_error, body


def test_tools_are_listed_with_schemas(world: AgentWorld) -> None:
    async def body(client: Client) -> Any:
        return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in session(world.stdio(), body)}
    assert set(tools) == {"query", "request_change", "get_request", "wait_for_decision",
                          "execute", "list_requests"}
    for tool in tools.values():
        assert tool.description and tool.input_schema["type"] == "object"
    assert tools["request_change"].input_schema["required"] == ["request_id", "reason",
                                                                "max_rows"]


def test_agent_reads_over_stdio(world: AgentWorld) -> None:
    async def body(client: Client) -> Any:
        first = await call(client, "query", sql=READ, request_id="read-1")
        return first, await call(client, "query", sql=READ, request_id="read-1")

    (failed, answer), (_, again) = session(world.stdio(), body)
    assert not failed, answer
    assert answer["status"] == "applied"
    assert answer["columns"] == ["balance"] and answer["rows"] == [[100]]
    # The same request id is the same read: its one nonce, answered from the ledger.
    assert again["id"] == answer["id"] and again["rows"] == [[100]]
    assert answer["replayed"] is False and again["replayed"] is True
    shown = world.human(world.bob, "requests", "show", answer["id"], "--json")
    assert shown.json["principal"] == AGENT
    assert shown.json["change"]["access"] == "read_only"


def test_write_waits_for_a_human_then_runs_once_over_http(world: AgentWorld) -> None:
    before = world.joined.bank.balances()

    async def ask(client: Client) -> Any:
        asked = await call(client, "request_change", request_id="debit-1",
                           reason="refund correction", statements=[{"sql": DEBIT}],
                           max_rows=1)
        waited = await call(client, "wait_for_decision", id=asked[1]["id"], timeout_seconds=1)
        return asked, waited

    (failed, asked), (_, waited) = session(world.client(), ask)
    assert not failed, asked
    assert asked["state"] == "awaiting_approval"
    assert asked["routing"]["outcome"] == "delegate" and asked["routing"]["approvals"] == 1
    assert asked["preview"]["total_rows"] == 1
    images = asked["preview"]["statements"][0]["row_images"]
    assert images["rows"][0]["before"]["balance"] == 100
    assert images["rows"][0]["after"]["balance"] == 90
    assert "wait_for_decision" in asked["next_step"]
    assert waited["decided"] is False and waited["state"] == "awaiting_approval"
    assert world.joined.bank.balances() == before  # nothing ran yet

    approved = world.human(world.bob, "approve", asked["id"], "--reason", "ok", "--json")
    assert approved.returncode == 0, approved
    rq = asked["id"]

    async def run(client: Client) -> Any:
        decided = await call(client, "wait_for_decision", id=rq, timeout_seconds=10)
        first = await call(client, "execute", id=rq)
        again = await call(client, "execute", id=rq)
        return decided, first, again

    (_, decided), (f1, first), (f2, again) = session(world.client(), run)
    assert decided["decided"] is True and decided["state"] == "prepared"
    assert decided["resolutions"][0]["approver"] == "bob"
    assert not f1 and first["outcome"]["status"] == "applied", first
    assert first["outcome"]["replayed"] is False
    assert not f2 and again["outcome"]["status"] == "applied"
    assert again["outcome"]["replayed"] is True and again["nonce"] == first["nonce"]
    assert world.joined.bank.balances()[1] == before[1] - 10  # changed once
    # Another server process (stdio) derives the same nonce: still answered, not run again.
    async def retry(client: Client) -> Any:
        return await call(client, "execute", id=rq)

    _, later = session(world.stdio(), retry)
    assert later["nonce"] == first["nonce"] and later["outcome"]["replayed"] is True
    assert world.joined.bank.balances()[1] == before[1] - 10
    # The logbook names the agent as who asked, and the human as who approved.
    entries = world.server.call("GET", f"/v1/requests/{rq}/logbook", world.bob).json()["entries"]
    actors = {e["kind"]: e["actor"] for e in entries}
    assert actors["request.preparing"] == AGENT and actors["checkpoint.sealed"] == AGENT
    assert actors["resolution.approve"] == "bob" and actors["execution.applied"] == "p1"



def test_agent_cannot_approve_its_own_change_any_way(world: AgentWorld) -> None:
    async def ask(client: Client) -> Any:
        return await call(client, "request_change", request_id="self-approve",
                          reason="try to approve it myself", statements=[{"sql": DEBIT}],
                          max_rows=1)

    _, asked = session(world.client(), ask)
    rq = asked["id"]
    assert asked["state"] == "awaiting_approval"
    # The HTTP API with its token.
    for action in ("approve", "reject", "expire"):
        answer = world.server.call("POST", f"/v1/requests/{rq}/{action}", world.token,
                                   json={"reason": "mine"})
        assert answer.status_code == 403 and answer.json()["code"] == "forbidden", answer.text
    # The CLI with its token.
    cli = world.human(world.token, "approve", rq, "--reason", "mine", "--json")
    assert cli.returncode == 2 and cli.json["error"]["code"] == "forbidden", cli
    # So is whatever could stand in for an approval: a Pilot of its own, a forged report,
    # or reading what only auditors read.
    for method, path, sent in (
            ("POST", "/v1/pilots", {"pilot_id": AGENT, "url": "http://127.0.0.1:9",
                                    "incarnation": "x", "targets": {}}),
            ("POST", "/v1/reports", {"pilot_id": "p1", "reports": []}),
            ("GET", "/v1/logbook", None), ("GET", "/v1/pilots", None),
            ("GET", "/metrics", None)):
        answer = world.server.call(method, path, world.token, json=sent)
        assert answer.status_code == 403, (path, answer.text)
    # The console: the agent's token never becomes a session.
    with httpx.Client(base_url=world.server.url, timeout=TIMEOUT) as browser:
        form = browser.get("/login")
        match = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert match, form.text
        signed = browser.post("/login", data={"token": world.token, "csrf": match.group(1)})
        assert signed.status_code == 403 and "forbidden" in signed.text
        assert "marque_session" not in "".join(signed.headers.get_list("set-cookie"))
        # The console's approve form without a session (its token as a bearer): to login.
        forged = browser.post(f"/requests/{rq}/approve", data={"reason": "mine"},
                              headers={"Authorization": f"Bearer {world.token}"})
        assert forged.status_code == 303 and "/login" in forged.headers["location"]
    shown = world.human(world.bob, "requests", "show", rq, "--json")
    assert shown.json["state"] == "awaiting_approval" and shown.json["resolutions"] == []
    # The human who decides sees that an AI agent asked.
    with httpx.Client(base_url=world.server.url, timeout=TIMEOUT) as browser:
        form = browser.get("/login")
        match = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert match, form.text
        assert browser.post("/login", data={"token": world.bob, "csrf": match.group(1)}
                            ).status_code == 303
        page = browser.get(f"/requests/{rq}")
        assert page.status_code == 200
        assert re.search(r'data-testid="requester">claude <span[^>]*requester-agent', page.text)


def test_over_the_routing_budget_is_denied(world: AgentWorld) -> None:
    async def ask(client: Client) -> Any:
        return await call(client, "request_change", request_id="too-big",
                          reason="a wide change", statements=[{"sql": DEBIT}], max_rows=50)

    failed, answer = session(world.client(), ask)
    assert failed
    error = answer["error"]
    assert error["code"] == "account_denied"
    assert "over the routing cap of 5" in error["message"]
    assert error["next_step"] and error["detail"]["request_id"] == "too-big"
    shown = world.human(world.bob, "requests", "show", error["detail"]["id"], "--json")
    assert shown.json["state"] == "failed"


def test_errors_are_tool_errors_with_code_and_next_step(world: AgentWorld) -> None:
    async def body(client: Client) -> Any:
        missing = await call(client, "get_request", id="rq_nothing")
        bad = await call(client, "execute", id="read-1", attempt=0)
        listed = await call(client, "list_requests")
        return missing, bad, listed

    (m_err, missing), (b_err, bad), (_, listed) = session(world.client(), body)
    assert m_err and missing["error"]["code"] == "not_found"
    assert "list_requests" in missing["error"]["next_step"]
    assert b_err and bad["error"]["code"] == "input_invalid"
    assert all(r["request_id"] for r in listed["requests"])


def test_it_will_not_start_as_a_human(world: AgentWorld) -> None:
    args = world.mcp_args()
    at = args.index("--token-file")
    args[at:at + 2] = ["--token", world.bob]
    refused = run_cli(*args, "--json", env=cli_env())
    assert refused.returncode == 2
    assert refused.json["error"]["code"] == "unauthenticated"
    assert "agent" in refused.json["error"]["message"]


def test_agent_principals_are_added_alone_and_with_a_key(world: AgentWorld) -> None:
    home = world.harbour.home
    keyless = run_cli("harbour", "principal", "add", "--home", home, "agent-2", "--role",
                      "agent", "--json")
    assert keyless.returncode == 2 and "needs --key" in keyless.json["error"]["message"]
    both = run_cli("harbour", "principal", "add", "--home", home, "agent-3", "--role", "agent",
                   "--role", "approver", "--key", world.pub, "--json")
    assert both.returncode == 2 and "cannot be combined" in both.json["error"]["message"]
    listed = cli_json("harbour", "principal", "list", "--home", home)
    names = {p["name"]: p["roles"] for p in listed["principals"]}
    assert names[AGENT] == ["agent"] and "agent-2" not in names and "agent-3" not in names


def test_a_query_is_a_read_or_it_does_not_run(world: AgentWorld) -> None:
    before = world.joined.bank.balances()

    async def body(client: Client) -> Any:
        wide = await call(client, "query", sql="SELECT id, balance FROM accounts", max_rows=2)
        write = await call(client, "query", sql=DEBIT, request_id="query-write", max_rows=1)
        return wide, write

    (w_err, wide), (_, write) = session(world.client(), body)
    # Three rows under a budget of two: refused whole, never cut to two.
    assert not w_err and wide["status"] == "aborted_not_applied"
    assert wide["error"]["code"] == "max_rows_exceeded" and wide["rows"] is None
    # A write sent as a query is routed as the write it is: nothing ran, a human decides.
    assert write["state"] == "awaiting_approval" and write["rows"] is None
    assert "did not allow this as a read" in write["next_step"]
    assert world.joined.bank.balances() == before


def test_an_agent_sees_only_its_own_requests(world: AgentWorld) -> None:
    alices = world.server.call("POST", "/v1/requests", world.joined.alice,
                               json=request_body(READ, request_id="alice-read"))
    assert alices.status_code == 201, alices.text
    rq = alices.json()["id"]

    async def body(client: Client) -> Any:
        by_id = await call(client, "get_request", id=rq)
        by_her_id = await call(client, "get_request", id="alice-read")
        listed = await call(client, "list_requests", limit=100)
        return by_id, by_her_id, listed

    (e1, by_id), (e2, by_her_id), (_, listed) = session(world.client(), body)
    assert e1 and by_id["error"]["code"] == "not_found"
    assert e2 and by_her_id["error"]["code"] == "not_found"
    assert rq not in {r["id"] for r in listed["requests"]}
    assert world.server.call("GET", f"/v1/requests/{rq}/marque", world.token).status_code == 404


def test_an_effect_set_waits_for_its_approver_too(world: AgentWorld) -> None:
    sent = effect_body([{"id": 1, "balance": 150}], request_id="topup-1", max_rows=3)

    async def body(client: Client) -> Any:
        return await call(client, "request_change", request_id="topup-1",
                          reason="top up account 1", max_rows=3,
                          effect_set=sent["change"]["effect_set"])

    failed, answer = session(world.client(), body)
    assert not failed, answer
    assert answer["state"] == "awaiting_approval"
    assert answer["preview"]["effect_preview_cid"].startswith("sha256:")
    assert TOPUP_DECLARATION["members"][0]["effect_id"] == "topup"


def matches(shown: Any, real: Any) -> bool:
    """Whether ``real`` has everything ``shown`` shows: objects by their shown keys, lists
    item by item, and a string with "…" as a pattern ("…" matching any text)."""
    if isinstance(shown, dict):
        return isinstance(real, dict) and all(
            key in real and matches(value, real[key]) for key, value in shown.items())
    if isinstance(shown, list):
        return isinstance(real, list) and len(real) >= len(shown) and all(
            matches(a, b) for a, b in zip(shown, real, strict=False))
    if isinstance(shown, str) and "…" in shown:
        pattern = ".*".join(re.escape(part) for part in shown.split("…"))
        return isinstance(real, str) and re.fullmatch(pattern, real, re.DOTALL) is not None
    return bool(shown == real)


def test_the_documented_transcript_holds(world: AgentWorld) -> None:
    steps = json.loads(doc_block("transcript"))
    async def play(client: Client, todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answers = []
        for step in todo:
            failed, answer = await call(client, step["call"], **step["arguments"])
            assert not failed, (step, answer)
            answers.append(answer)
        return answers

    before = world.joined.bank.balances()
    human = next(i for i, step in enumerate(steps) if "human" in step)
    first = session(world.client(), lambda c: play(c, steps[:human]))
    asked = next(a for s, a in zip(steps, first, strict=False) if s["call"] == "request_change")
    command = steps[human]["human"].replace("rq_…", asked["id"])
    argv = [part.strip("'") for part in re.findall(r"'[^']*'|\S+", command)]
    assert argv[0] == "marque"
    approved = world.human(world.bob, *argv[1:], "--json")
    assert approved.returncode == 0, approved
    rest = session(world.stdio(), lambda c: play(c, steps[human + 1:]))
    for step, answer in zip([s for s in steps if "call" in s], [*first, *rest], strict=True):
        assert matches(step["answer"], answer), (step, answer)
    assert world.joined.bank.balances()[3] == before[3] - 25  # once, despite two executes


def test_the_documented_client_config_starts_the_server(world: AgentWorld) -> None:
    server = json.loads(doc_block("mcp config"))["mcpServers"]["marque"]
    assert server["command"] == "marque"
    args = [{"https://harbour.example": world.server.url,
             "/home/agent/.config/marque/claude.token": str(world.token_file),
             "/home/agent/.config/marque/claude.jwk": str(world.key)}.get(arg, arg)
            for arg in server["args"]]
    client = Client(StdioServerParameters(command=str(MARQUE), args=args, env=cli_env()),
                    read_timeout_seconds=60)

    async def body(connected: Client) -> Any:
        return await call(connected, "list_requests", limit=1)

    failed, listed = session(client, body)
    assert not failed and "requests" in listed


def test_the_http_endpoint_refuses_another_host(world: AgentWorld) -> None:
    """A page on another site that makes the browser post to the loopback endpoint (DNS
    rebinding) is refused: the endpoint acts as the agent for whoever reaches it."""
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    answer = httpx.post(world.http.url, json=hello, timeout=TIMEOUT,
                        headers={"Host": "evil.example", "Accept": "application/json, "
                                 "text/event-stream"})
    assert answer.status_code in (403, 421), answer.text


def test_an_ended_request_still_answers_execute_from_what_was_reported(
        world: AgentWorld) -> None:
    """A change that cannot apply (the row it inserts appeared after approval) runs out of
    attempts and ends `failed`; `execute` then answers the outcome its Pilot reported for
    that nonce — it never runs again — where the marque is no longer handed out."""
    async def ask(client: Client) -> Any:
        return await call(client, "request_change", request_id="insert-9",
                          reason="open account 9", max_rows=1,
                          statements=[{"sql": "INSERT INTO accounts VALUES (9, 1)"}])

    _, asked = session(world.client(), ask)
    rq = asked["id"]
    assert world.human(world.bob, "approve", rq, "--json").returncode == 0
    conn = sqlite3.connect(world.joined.bank.bank)
    with conn:
        conn.execute("INSERT INTO accounts VALUES (9, 500)")
    conn.close()

    async def run(client: Client) -> Any:
        return [await call(client, "execute", id=rq) for _ in range(3)]

    tries = session(world.client(), run)
    assert [t[1]["outcome"]["status"] for t in tries] == ["aborted_not_applied"] * 3
    assert [t[1]["outcome"]["attempt"] for t in tries] == [1, 2, 3]
    ended = wait_for_request(world.server.call, rq, world.bob,
                             lambda r: r["state"] == "failed", 60)
    assert ended["state"] == "failed", ended

    async def again(client: Client) -> Any:
        return await call(client, "execute", id=rq)

    failed, answer = session(world.client(), again)
    assert not failed, answer
    assert answer["reported"] is True and answer["nonce"] == tries[0][1]["nonce"]
    assert answer["outcome"]["status"] == "aborted_not_applied"
    assert answer["outcome"]["attempt"] == 3
    assert answer["outcome"]["error"]["code"] == "statement_error"
    assert world.joined.bank.balances()[9] == 500  # never inserted over
