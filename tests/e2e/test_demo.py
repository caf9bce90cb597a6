"""`marque demo`: the whole story, narrated, on embedded defaults."""

from __future__ import annotations

from e2e_support import run_cli


def test_demo_narrates_every_step() -> None:
    """`marque demo` exits 0 and narrates every step, balances and ledger stats."""
    res = run_cli("demo", timeout=60)
    assert res.returncode == 0, res
    text = res.stdout.lower()
    for word in ("applied", "replayed", "budget_exhausted", "max_rows_exceeded",
                 "balances before", "balances after", "ledger", "claims",
                 "unreported_outcomes"):
        assert word in text, f"demo narration lacks {word!r}"
