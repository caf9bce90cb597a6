"""`marque demo`: the whole story, narrated, on embedded defaults, through real services."""

from __future__ import annotations

import json

from e2e_support import run_cli


def test_demo_narrates_every_step() -> None:
    """`marque demo` exits 0 and narrates the walk from request to verified logbook."""
    res = run_cli("demo", timeout=120)
    assert res.returncode == 0, res
    text = res.stdout.lower()
    for word in ("delegate", "preview (rollback)", "self_approval", "revalidated and issued",
                 "applied once", "replayed", "budget_exhausted", "verified",
                 "execution.applied", "intact", "balances before", "balances after",
                 "every step behaved"):
        assert word in text, f"demo narration lacks {word!r}"
    # The change takes 10 from account 1 (balances after: 90, 100): a debit, never a refund.
    assert "a debit of 10 from account 1" in text
    assert "refund" not in text


def test_demo_json_reports_each_step_and_the_bank_changed_once() -> None:
    """`marque demo --json`: one object; every step ok; the request verified; one debit."""
    res = run_cli("demo", "--json", timeout=120)
    assert res.returncode == 0, res
    body = json.loads(res.stdout)
    assert body["ok"] is True
    names = [step["step"] for step in body["steps"]]
    assert names == ["routed", "previewed", "same_request", "self_approval", "approved",
                     "applied", "replayed", "budget_exhausted", "verified", "logbook",
                     "logbook_verified", "stopped"]
    assert all(step["ok"] for step in body["steps"]), body["steps"]
    assert body["before"] == {"1": 100, "2": 100} and body["after"] == {"1": 90, "2": 100}
    assert body["request"]["state"] == "verified"
    assert "refund" not in json.dumps(body["request"])  # a debit, told as one
    assert [e["status"] for e in body["request"]["executions"]] == ["applied"]
