"""The web console in a real browser (issue 12): approve, refuse, sessions, escaping, audit.

One world for the module (``conftest.make_world``): `harbour serve`, a joined
`pilot serve`, principals made by the CLI. Every test makes its own requests,
so none depends on another's order; each person is a separate browser context.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from support.harbour import DEBIT
from support.wait import wait_until

from marque.token.reports import sign_report

from .conftest import DEBIT_RETURNING, Console, World, fresh_id

Consoles = Callable[..., Console]


def status_state(console: Console) -> str:
    state: str = console.page.get_by_test_id("status").get_attribute("data-state")
    return state


def test_two_approvers_approve_and_the_execution_appears_without_a_reload(
        world: World, consoles: Consoles) -> None:
    """Carol reads the waiting request's preview rows and approves; Dave's approval completes
    it (prepared, marque issued); Alice runs it from the CLI and Dave's page shows the
    execution and `verified` without reloading."""
    made = world.submit("alice", DEBIT_RETURNING, reason="refund ticket 4521")
    carol = consoles("carol")
    page = carol.page
    waiting = page.get_by_test_id("waiting")
    waiting.get_by_role("link", name=made["id"]).click()
    page.wait_for_url(f"**/requests/{made['id']}")
    sample = page.get_by_test_id("sample-1")
    assert sample.locator("thead th").all_inner_texts() == ["id", "balance"]
    assert sample.locator("tbody tr").first.locator("td").all_inner_texts() == ["1", "90"]
    assert page.get_by_test_id("preview-mode").inner_text().startswith("rollback")
    assert page.get_by_test_id("preview-rows-1").inner_text() == "1"
    page.get_by_label("Reason").fill("matches the ticket")
    page.get_by_test_id("approve").click()
    page.wait_for_url("**?done=approved")
    assert "Your approval is recorded" in page.get_by_role("status").first.inner_text()
    resolutions = page.get_by_test_id("resolutions").inner_text()
    assert "carol" in resolutions and "matches the ticket" in resolutions
    assert status_state(carol) == "awaiting_approval"  # one of two

    dave = consoles("dave")
    dave.page.goto(f"/requests/{made['id']}")
    assert "1 of 2" in dave.page.locator("#decide").inner_text()
    dave.page.get_by_label("Reason").fill("second pair of eyes")
    dave.page.get_by_test_id("approve").click()
    dave.page.wait_for_url("**?done=approved")
    assert status_state(dave) == "prepared"
    marque = dave.page.get_by_test_id("marque")
    budget = marque.get_by_test_id("marque-budget").inner_text()
    assert "1 execution(s) · at most 1 row(s)" in budget
    assert world.request(made["id"])["marque_id"] in marque.inner_text()
    assert dave.page.get_by_test_id("decide-form").count() == 0

    dave.page.evaluate("window.__sameDocument = true")
    outcome = world.exec_cli(made["id"], "alice", "n1")
    assert outcome["status"] == "applied"
    dave.page.get_by_test_id("status").and_(
        dave.page.locator("[data-state=verified]")).wait_for()
    executions = dave.page.get_by_test_id("executions")
    assert "n1" in executions.inner_text() and "applied" in executions.inner_text()
    assert executions.get_by_test_id("rows").first.inner_text() == "1"
    timeline = [" ".join(t.split()) for t in executions.locator(".events li").all_text_contents()]
    assert any(line.startswith("claimed") for line in timeline), timeline
    assert any(line.startswith("committed") for line in timeline), timeline
    assert dave.page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    assert world.bank.balances()[1] == 90
    # An approver reads the request's own logbook entries on its page.
    dave.page.reload()
    entries = dave.page.get_by_test_id("request-logbook").inner_text()
    for kind in ("checkpoint.sealed", "resolution.approve", "marque.issued"):
        assert kind in entries, entries


def test_the_requester_sees_no_approve_button_and_a_forged_approval_is_self_approval(
        world: World, consoles: Consoles) -> None:
    """Erin (requester and approver) is offered no approve form on her own request; posting
    the approval form anyway (with her valid CSRF token) is refused by the core with
    `self_approval`, and nothing is recorded."""
    made = world.submit("erin", DEBIT, reason="my own change")
    erin = consoles("erin")
    assert erin.page.get_by_test_id("waiting").count() == 0 or \
        erin.page.get_by_test_id("waiting").get_by_text(made["id"]).count() == 0
    erin.page.goto(f"/requests/{made['id']}")
    assert erin.page.get_by_test_id("approve").count() == 0
    assert "self_approval" in erin.page.get_by_test_id("why-not").inner_text()
    token = erin.csrf()
    erin.page.evaluate("""([id, token]) => {
        const form = document.createElement("form");
        form.method = "post"; form.action = `/requests/${id}/approve`;
        for (const [name, value] of [["csrf", token], ["reason", "forged"]]) {
            const input = document.createElement("input");
            input.type = "hidden"; input.name = name; input.value = value; form.append(input);
        }
        document.body.append(form); form.submit();
    }""", [made["id"], token])
    erin.page.wait_for_load_state()
    error = erin.page.get_by_test_id("error")
    assert "self_approval" in error.inner_text()
    answer = erin.page.request.post(f"/requests/{made['id']}/approve",
                                    form={"csrf": token, "reason": "forged"})
    assert answer.status == 403 and "self_approval" in answer.text()
    after = world.request(made["id"])
    assert after["state"] == "awaiting_approval" and after["resolutions"] == []


def test_a_form_without_its_csrf_token_or_with_another_sessions_is_refused(
        world: World, consoles: Consoles) -> None:
    """Carol's approval POSTed with no CSRF token, then with Dave's session's token, is
    refused (403, said as a CSRF refusal) and records nothing; with her own it goes in."""
    made = world.submit("alice", DEBIT)
    carol, dave = consoles("carol"), consoles("dave")
    path = f"/requests/{made['id']}/approve"
    missing = carol.page.request.post(path, form={"reason": "no token"})
    assert missing.status == 403 and "CSRF token" in missing.text()
    assert "without its CSRF token" in missing.text()
    foreign = carol.page.request.post(path, form={"csrf": dave.csrf(), "reason": "dave's"})
    assert foreign.status == 403 and "not this session" in foreign.text()
    assert world.request(made["id"])["resolutions"] == []
    own = carol.page.request.post(path, form={"csrf": carol.csrf(), "reason": "mine"})
    assert own.ok
    assert [r["approver"] for r in world.request(made["id"])["resolutions"]] == ["carol"]


def test_expired_logged_out_and_revoked_sessions_are_sent_to_login(
        world: World, consoles: Consoles) -> None:
    """A logged-out session (even replayed from a saved cookie), an expired one and one
    whose principal was revoked all land on the login page, saying why."""
    carol = consoles("carol")
    saved = carol.context.cookies()
    cookie = next(c for c in saved if c["name"] == "marque_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert carol.page.evaluate("document.cookie").find("marque_session") == -1
    carol.page.get_by_role("button", name="Log out").click()
    carol.page.wait_for_url("**/login?why=logged_out")
    assert "You have logged out" in carol.page.get_by_test_id("login-message").inner_text()
    carol.page.goto("/pilots")
    assert "/login" in carol.page.url
    replay = consoles(None)
    replay.context.add_cookies(saved)
    replay.page.goto("/")
    assert "/login" in replay.page.url
    assert "logged out" in replay.page.get_by_test_id("login-message").inner_text()

    dave = consoles("dave")
    with sqlite3.connect(world.store_path) as conn:
        conn.execute("UPDATE console_sessions SET expires_at = 0 WHERE principal = 'dave'")
    dave.page.goto("/pilots")
    assert "/login" in dave.page.url and "next=%2Fpilots" in dave.page.url
    assert "expired" in dave.page.get_by_test_id("login-message").inner_text()
    dave.login("dave")  # back where it was going
    assert dave.page.url.endswith("/pilots")

    world.harbour.add("tmp-approver", "approver")
    temp = consoles("tmp-approver")
    world.harbour.revoke("tmp-approver")
    temp.page.goto("/")
    assert "/login" in temp.page.url
    assert "revoked" in temp.page.get_by_test_id("login-message").inner_text()


def test_script_tags_and_quotes_in_a_request_render_as_text(
        world: World, consoles: Consoles) -> None:
    """A request whose reason, request id and SQL hold `<script>` and quotes shows them as
    text in the queue and on its page: no element is injected and no dialog ever opens."""
    reason = "<script>alert('reason')</script> \"quoted\" & 'single' <img src=x onerror=alert(2)>"
    sql = ("UPDATE accounts SET balance = balance - 1 WHERE id = 1 "
           "AND '<script>alert(\"sql\")</script>' <> 'it''s \"x\"'")
    request_id = fresh_id("<b onmouseover=alert(3)>x</b>")
    made = world.submit("alice", sql, reason=reason, request_id=request_id)
    carol = consoles("carol")
    assert carol.page.get_by_test_id("all").get_by_text(reason).count() >= 1
    carol.page.goto(f"/requests/{made['id']}")
    page = carol.page
    assert page.get_by_test_id("reason").inner_text() == reason
    assert page.get_by_test_id("sql-1").inner_text() == sql
    assert request_id in page.locator(".request-head").inner_text()
    scripts = page.evaluate("[...document.scripts].map(s => s.src)")
    assert len(scripts) == 1 and "/static/console.js" in scripts[0]
    assert page.locator("img").count() == 0 and page.locator("main b").count() == 0
    page.hover("[data-testid=reason]")
    page.wait_for_timeout(300)
    assert carol.dialogs == []
    assert page.get_by_test_id("sql-1").locator(".sql-string").count() == 2


def test_a_reject_without_a_reason_shows_the_form_again_with_the_error(
        world: World, consoles: Consoles) -> None:
    """Reject with no reason: the page comes back (400) with `input_invalid`, the form still
    there; with a reason the request is rejected and says who and why."""
    made = world.submit("alice", DEBIT)
    carol = consoles("carol")
    carol.page.goto(f"/requests/{made['id']}")
    with carol.page.expect_response(re.compile(r".*/reject$")) as answer:
        carol.page.get_by_test_id("reject").click()
    assert answer.value.status == 400
    assert "input_invalid" in carol.page.get_by_test_id("error").inner_text()
    carol.page.get_by_label("Reason").fill("wrong account")
    carol.page.get_by_test_id("reject").click()
    carol.page.wait_for_url("**?done=rejected")
    assert status_state(carol) == "rejected"
    assert "wrong account" in carol.page.get_by_test_id("resolutions").inner_text()


def test_an_unknown_outcome_is_shown_as_needing_a_human_not_as_a_failure(
        world: World, consoles: Consoles) -> None:
    """An indeterminate report moves a prepared request to reconciliation: the queue lists
    it under "Needs a human", its page says unknown in the unknown colour, never the
    failure colour, and the attempt reads indeterminate."""
    made = world.submit("alice", "SELECT balance FROM accounts WHERE id = 2")
    assert made["state"] == "prepared"
    report = {"marque_id": made["marque_id"], "nonce": "lost-1", "attempt": 1,
              "status": "indeterminate", "rows_affected": None, "error": None,
              "cause": "lease_expired",
              "pilot": {"id": "p1", "incarnation": world.bank.incarnation}}
    # Signed with the Pilot's own report key, as its reporter signs what it delivers.
    key = json.loads((world.bank.home / "report-key.jwk").read_text())
    signed = {**report, "signature": sign_report(report, key)}
    posted = world.api("POST", "/v1/reports", "p1", json={"pilot_id": "p1", "reports": [signed]})
    assert posted.status_code == 200, posted.text
    assert world.request(made["id"])["state"] == "reconciliation"
    carol = consoles("carol")
    assert carol.page.get_by_test_id("needs-human").get_by_text(made["id"]).count() == 1
    carol.page.goto(f"/requests/{made['id']}")
    badge = carol.page.get_by_test_id("status").locator(".badge")
    assert "reconciliation: unknown" in badge.inner_text()
    assert "tone-unknown" in (badge.get_attribute("class") or "")
    colour = badge.evaluate("b => getComputedStyle(b).color")
    failure = carol.page.evaluate("""() => { const s = document.createElement('span');
        s.className = 'badge tone-bad'; document.body.append(s);
        return getComputedStyle(s).color; }""")
    assert colour != failure
    attempt = carol.page.get_by_test_id("executions")
    assert "indeterminate: unknown" in attempt.inner_text()
    assert "A human must look" in attempt.inner_text()


def test_the_pilots_page_shows_live_ledger_figures_and_an_unreachable_pilot_honestly(
        world: World, consoles: Consoles) -> None:
    """p1 answers its health (figures shown); a registered Pilot that is down is
    "unreachable" with no figures; its changed incarnation is a finding an auditor reads
    with what it means and what to do."""
    world.harbour.add("p9", "pilot")
    body = {"pilot_id": "p9", "url": "http://127.0.0.1:9", "incarnation": "inc-a",
            "targets": {"bank": {"dialect": "sqlite"}}}
    for incarnation in ("inc-a", "inc-b"):
        answer = world.api("POST", "/v1/pilots", "p9", json={**body, "incarnation": incarnation})
        assert answer.status_code == 200, answer.text
    carol = consoles("carol")
    carol.page.goto("/pilots")
    p1 = carol.page.locator("[data-pilot=p1]")
    assert "reachable" in p1.locator(".badge").inner_text()
    assert p1.get_by_test_id("unreported").inner_text().isdigit()
    assert p1.get_by_test_id("indeterminate").inner_text().isdigit()
    assert world.bank.incarnation in p1.inner_text()
    p9 = carol.page.locator("[data-pilot=p9]")
    assert "unreachable" in p9.locator(".badge").inner_text()
    assert p9.get_by_test_id("unreported").count() == 0
    assert "Findings are logbook entries" in carol.page.inner_text("main")

    audrey = consoles("audrey")
    audrey.page.goto("/pilots")
    finding = audrey.page.get_by_test_id("finding").filter(has_text="p9").first
    text = finding.inner_text()
    assert "ledger changed incarnation" in text and "What to do" in text


def test_an_auditor_sees_the_logbook_verified_and_then_broken_at_the_edited_seq(
        world: World, consoles: Consoles) -> None:
    """Audrey's logbook page says verified; after one byte of entry N's row is changed in
    the SQLite store it says broken at seq N; restored, verified again."""
    audrey = consoles("audrey")
    audrey.page.goto("/logbook")
    chain = audrey.page.get_by_test_id("chain")
    assert chain.get_attribute("data-verified") == "true"
    assert "Chain verified" in chain.inner_text()
    audrey.page.get_by_label("Kind starts with").fill("principal.")
    audrey.page.get_by_role("button", name="Filter").click()
    kinds = audrey.page.get_by_test_id("entries").locator("tbody tr td:nth-child(3)")
    assert kinds.count() > 0 and all(k.startswith("principal.") for k in kinds.all_inner_texts())

    target = 3
    with sqlite3.connect(world.store_path) as conn:
        (actor,) = conn.execute("SELECT actor FROM logbook WHERE seq = ?", (target,)).fetchone()
        edited = chr(ord(actor[0]) ^ 1) + actor[1:]  # one byte, one bit
        conn.execute("UPDATE logbook SET actor = ? WHERE seq = ?", (edited, target))
    try:
        audrey.page.goto("/logbook")
        chain = audrey.page.get_by_test_id("chain")
        assert chain.get_attribute("data-verified") == "false"
        assert chain.get_attribute("data-seq") == str(target)
        assert f"Chain broken at seq {target}" in chain.inner_text()
        # The page opens at the newest entries; the verdict links to the broken one.
        audrey.page.get_by_test_id("break-link").click()
        assert audrey.page.locator(f"tr[data-seq='{target}']").get_attribute("class") == \
            "untrusted"
    finally:
        with sqlite3.connect(world.store_path) as conn:
            conn.execute("UPDATE logbook SET actor = ? WHERE seq = ?", (actor, target))
    audrey.page.goto("/logbook")
    assert audrey.page.get_by_test_id("chain").get_attribute("data-verified") == "true"


def test_the_logbook_opens_at_the_newest_entries_and_filters_by_request_actor_and_kind(
        world: World, consoles: Consoles) -> None:
    """Audrey's logbook page starts at the newest entry and goes back; the form (a plain GET,
    no JavaScript needed) narrows it to one request's entries, then to one actor's."""
    made = world.submit("alice", DEBIT, reason="logbook filters")
    world.approve(made["id"], "carol")
    head = world.api("GET", "/v1/logbook/head", "admin").json()["seq"]
    audrey = consoles("audrey", javascript=False)
    page = audrey.page
    page.goto("/logbook")
    seqs = [int(row.get_attribute("data-seq"))
            for row in page.get_by_test_id("entries").locator("tbody tr").all()]
    assert seqs[0] >= head and seqs == sorted(seqs, reverse=True), seqs
    if len(seqs) == 50:
        page.get_by_role("link", name="Older entries").click()
        older = [int(row.get_attribute("data-seq"))
                 for row in page.get_by_test_id("entries").locator("tbody tr").all()]
        assert older and older[0] < seqs[-1]

    page.goto("/logbook")
    page.get_by_label("Request or subject").fill(made["id"])
    page.get_by_role("button", name="Filter").click()
    rows = page.get_by_test_id("entries").locator("tbody tr")
    subjects = rows.locator("td:nth-child(5)").all_inner_texts()
    assert subjects and set(subjects) == {made["id"]}, subjects
    kinds = rows.locator("td:nth-child(3)").all_inner_texts()
    assert kinds[-1] == "request.preparing", kinds  # newest first, so its first entry last

    page.get_by_label("Actor").fill("carol")
    page.get_by_role("button", name="Filter").click()
    assert f"subject={made['id']}" in page.url and "actor=carol" in page.url
    actors = rows.locator("td:nth-child(4)").all_inner_texts()
    assert actors and set(actors) == {"carol"}, actors
    assert "resolution.approve" in rows.locator("td:nth-child(3)").all_inner_texts()


def test_the_queue_filters_by_state_and_counts_each(world: World, consoles: Consoles) -> None:
    """The state filter shows only that state's requests; the count beside it matches."""
    world.submit("alice", DEBIT)
    carol = consoles("carol")
    count = int(carol.page.locator("[data-state-count=awaiting_approval]").inner_text())
    carol.page.get_by_label("State", exact=True).select_option("awaiting_approval")
    carol.page.get_by_role("button", name="Filter").click()
    carol.page.wait_for_url("**/?state=awaiting_approval")
    rows = carol.page.get_by_test_id("all").locator("tbody tr")
    assert rows.count() == count > 0
    badges = {" ".join(text.split()) for text in rows.locator(".badge").all_inner_texts()}
    assert badges == {"● awaiting approval"}
    carol.page.goto("/?state=nonsense")
    assert "input_invalid" in carol.page.get_by_test_id("error").inner_text()


def test_keyboard_users_can_skip_to_the_content(world: World, consoles: Consoles) -> None:
    """The first Tab reaches the skip link, which moves focus to the main content."""
    carol = consoles("carol")
    carol.page.keyboard.press("Tab")
    focused: Any = carol.page.evaluate("document.activeElement.textContent")
    assert focused.strip() == "Skip to content"
    carol.page.keyboard.press("Enter")
    wait_until(lambda: carol.page.evaluate("document.activeElement.id") == "main",
               "focus on main", step=0.1)
