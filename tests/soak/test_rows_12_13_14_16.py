"""The fast form of matrix rows 12, 13, 14 and 16 in `make test`, and proof their checkers can fail.

Each row runs through the same function the soak runs, with a small count,
into ``tmp_path``; then each row is run once more with a deliberate weakness
of our own making (a tamper not applied, a verifier that accepts, a valid
proof where an abuse was due, ``warn`` where ``require`` was due) and must
report it as a violation.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from soak.scenario import History, RunContext, ScenarioResult
from soak.scenarios import durability, forgery, proofs, tamper


def _run(run: Any, tmp_path: Path, count: int, pg: str | None = None,
         **kwargs: Any) -> ScenarioResult:
    ctx = RunContext(run.__module__, count, random.randrange(2**32), tmp_path,
                     History(tmp_path / "history.jsonl"), pg_admin_dsn=pg)
    try:
        return run(ctx, **kwargs)
    finally:
        ctx.history.close()


def test_row_12_every_tamper_is_named_at_its_seq(tmp_path: Path, pg_admin_dsn: str) -> None:
    """Flips, deletions, reorderings and truncations of three logbooks: each named at its seq
    (every tamper kind twice on each logbook, the first round through the real CLI too)."""
    count = 2 * len(tamper.TAMPERS) * 3
    result = _run(tamper.run, tmp_path, count, pg_admin_dsn)
    assert result.ok, result.violations
    assert result.cases == count and result.figures["cli_runs"] >= 3
    assert all(set(kinds) == set(tamper.TAMPERS) for kinds in
               result.figures["by_logbook"].values()), result.figures["by_logbook"]


def test_row_12_checker_reports_a_tamper_that_went_unnoticed(tmp_path: Path) -> None:
    """A tamper asked about but never applied is reported: verification said intact."""
    result = _run(tamper.run, tmp_path, 10, skip_apply=lambda t: t.kind == "flip")
    assert any("flipped" in v and "named None" in v for v in result.violations), \
        result.violations


def test_row_13_no_forgery_is_accepted(tmp_path: Path) -> None:
    """Every named forgery and every fuzzed token is refused with a typed error, also over HTTP."""
    result = _run(forgery.run, tmp_path, forgery.VECTORS + 100)
    assert result.ok, result.violations[:20]
    assert result.cases == forgery.VECTORS + 100
    assert result.figures["http_sent"] >= 36


def test_row_13_checker_reports_acceptance_and_untyped_errors(tmp_path: Path) -> None:
    """A verifier that accepts query tokens, and one that raises KeyError, are both reported."""
    def weaken(real: forgery.Verifiers) -> forgery.Verifiers:
        def crash(token: str) -> None:
            raise KeyError("kid")

        real.by_kind["query"] = lambda token: None
        real.by_kind["preview"] = crash
        return real

    result = _run(forgery.run, tmp_path, forgery.VECTORS, verifiers=weaken)
    assert any(v.startswith("ACCEPTED query:") for v in result.violations)
    assert any("untyped error KeyError" in v for v in result.violations)


def test_row_14_every_proof_abuse_is_refused_with_its_code(tmp_path: Path) -> None:
    """Two rounds of every abuse kind: each refused with its code, nothing claimed or spent."""
    count = 2 * len(proofs.KINDS)
    result = _run(proofs.run, tmp_path, count)
    assert result.ok, result.violations
    assert result.cases == count


def test_row_14_checker_reports_an_abuse_that_was_honoured(tmp_path: Path) -> None:
    """A valid proof where an abuse was due applies, and the row reports it and its spending."""
    result = _run(proofs.run, tmp_path, len(proofs.KINDS),
                  accept=lambda kind: kind == "other_nonce")
    assert any(v.startswith("ACCEPTED other_nonce") for v in result.violations)
    assert any(v.startswith("budget:") for v in result.violations)


def test_row_16_a_ledger_that_is_not_durable_is_refused_or_warned(
        tmp_path: Path, pg_admin_dsn: str) -> None:
    """SQLite and PostgreSQL ledgers: refused when not durable, served with a warning on warn."""
    result = _run(durability.run, tmp_path, len(durability.CASES), pg_admin_dsn)
    assert result.ok, result.violations
    assert result.cases == len(durability.CASES)
    assert set(result.figures["cases"].values()) == {"passed"}


def test_row_16_checker_reports_a_start_that_should_have_been_refused(tmp_path: Path) -> None:
    """With warn written where require was due, the weakened SQLite ledger is reported."""
    result = _run(durability.run, tmp_path, 2, policy_override="warn")
    assert any("let a ledger with synchronous=OFF through" in v for v in result.violations)
