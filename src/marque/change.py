"""The approved work a marque carries: its statements, guards, isolation and budget.

A marque approves either statements (:class:`Change`) or one Effect Set preview
(:class:`EffectSetChange`, DESIGN §7): the latter names only the preview's
``effect_preview_cid``, whose content the Pilot holds in its ledger.
:func:`change_from_claim` reads either from a token's ``change`` claim.

A :class:`Change` is exactly what approval signed — statements with their
parameters, optional guards, an isolation level, a statement timeout and, for
a change approved as a read, ``access: "read_only"`` — and its ``change_cid``
(DESIGN §8) names it. A :class:`Budget` is what the marque may
spend. Both are checked twice over: when built in code (``InvalidInput``) and
when read back from a received token's claims (``MarqueInvalid``, strictly: the
exact shape :meth:`Change.to_claim` produces, and a CID that matches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from marque.cid import MAX_SAFE_INT, cid
from marque.errors import InvalidInput, MarqueError, MarqueInvalid
from marque.sqltext import SqlTextError, check_statement

__all__ = ["ISOLATION_LEVELS", "GUARD_WHEN", "ACCESS_MODES", "READ_ONLY", "Budget", "Statement",
           "Guard", "Change", "EffectSetChange", "AnyChange", "change_from_claim", "is_json_int"]

#: Isolation levels a change may ask for.
ISOLATION_LEVELS = ("read_committed", "repeatable_read", "serializable")
#: When a guard is checked, relative to the statements.
GUARD_WHEN = ("before", "after", "both")
#: A change approved as a read (DESIGN §11.3): the Pilot runs it in a transaction the
#: database itself keeps read-only after the stamp.
READ_ONLY = "read_only"
#: The values ``access`` may take. Absent means read-write, and is never written out,
#: so a change without it keeps the CID it always had.
ACCESS_MODES = (READ_ONLY,)

_BUDGET_KEYS = frozenset({"executions", "max_rows", "attempts_per_nonce"})
_CHANGE_KEYS = frozenset(
    {"statements", "guards", "isolation", "statement_timeout_ms", "change_cid"}
)
_CHANGE_OPTIONAL_KEYS = frozenset({"access"})
_STATEMENT_KEYS = frozenset({"sql", "params"})
_STATEMENT_OPTIONAL_KEYS = frozenset({"expect_rows"})
_GUARD_KEYS = frozenset({"sql", "params", "expect", "when"})


def is_json_int(value: Any) -> bool:
    """An integer that is not a bool (JSON has no booleans-as-numbers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_scalar(value: Any, where: str, error: type[MarqueError]) -> None:
    if value is None or isinstance(value, str | bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INT:
            raise error(f"{where}: integer {value} is too large for JSON (more than 2**53)")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise error(f"{where}: {value!r} is not a finite number")
        return
    raise error(f"{where}: {type(value).__name__} is not a JSON scalar")


def _check_params(value: Any, where: str, error: type[MarqueError]) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise error(f"{where}.params must be a list of JSON scalars")
    for index, item in enumerate(value):
        _check_scalar(item, f"{where}.params[{index}]", error)
    return tuple(value)


def _check_sql(value: Any, where: str, error: type[MarqueError]) -> str:
    if not isinstance(value, str) or not value.strip():
        raise error(f"{where}.sql must be a non-empty string")
    try:
        return check_statement(value)
    except SqlTextError as exc:
        raise error(f"{where}.sql {exc}") from exc


def _check_keys(
    data: Any, allowed: frozenset[str], where: str, optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise MarqueInvalid(f"{where} must be a JSON object")
    missing = sorted(allowed - data.keys())
    if missing:
        raise MarqueInvalid(f"{where} lacks {', '.join(missing)}")
    unknown = sorted(str(k) for k in data.keys() - allowed - optional)
    if unknown:
        raise MarqueInvalid(f"{where} has unknown member(s) {', '.join(unknown)}")
    return data


@dataclass(frozen=True)
class Budget:
    """What a marque may spend: executions (nonces), rows per execution, attempts per nonce."""

    executions: int
    max_rows: int
    attempts_per_nonce: int = 3

    def __post_init__(self) -> None:
        _check_budget(self.executions, self.max_rows, self.attempts_per_nonce, InvalidInput)

    def to_claim(self) -> dict[str, int]:
        """The ``budget`` claim: ``{executions, max_rows, attempts_per_nonce}``."""
        return {
            "executions": self.executions,
            "max_rows": self.max_rows,
            "attempts_per_nonce": self.attempts_per_nonce,
        }

    @classmethod
    def from_claim(cls, data: Any) -> Budget:
        """Read a ``budget`` claim; anything but the exact shape raises :class:`MarqueInvalid`."""
        data = _check_keys(data, _BUDGET_KEYS, "budget")
        _check_budget(
            data["executions"], data["max_rows"], data["attempts_per_nonce"], MarqueInvalid
        )
        return cls(data["executions"], data["max_rows"], data["attempts_per_nonce"])


def _check_budget(
    executions: Any, max_rows: Any, attempts_per_nonce: Any, error: type[MarqueError]
) -> None:
    for name, value, least in (
        ("executions", executions, 1),
        ("max_rows", max_rows, 0),
        ("attempts_per_nonce", attempts_per_nonce, 1),
    ):
        if not is_json_int(value):
            raise error(f"budget.{name} must be an integer, got {type(value).__name__}")
        if value < least:
            raise error(f"budget.{name} must be at least {least}, got {value}")
        if value > MAX_SAFE_INT:
            raise error(f"budget.{name} is too large")


@dataclass(frozen=True)
class Statement:
    """One approved SQL statement and its bound parameters (JSON scalars).

    ``expect_rows``, when set, is the exact number of rows the statement must
    touch: any other count rolls the whole attempt back (``undo_conflict``). A
    generated undo fences each row this way (docs/harbour.md "Undo"); absent, the
    claim and its CID are what they always were.
    """

    sql: str
    params: tuple[Any, ...] = ()
    expect_rows: int | None = None

    def __post_init__(self) -> None:
        _check_sql(self.sql, "statement", InvalidInput)
        object.__setattr__(self, "params", _check_params(self.params, "statement", InvalidInput))
        _check_expect_rows(self.expect_rows, InvalidInput)

    def to_claim(self) -> dict[str, Any]:
        """The statement as it appears in the ``change`` claim."""
        claim: dict[str, Any] = {"sql": self.sql, "params": list(self.params)}
        if self.expect_rows is not None:
            claim["expect_rows"] = self.expect_rows
        return claim


def _check_expect_rows(value: Any, error: type[MarqueError]) -> None:
    if value is None:
        return
    if not is_json_int(value) or value < 0 or value > MAX_SAFE_INT:
        raise error("statement.expect_rows must be a whole number of rows (0 or more) or absent")


@dataclass(frozen=True)
class Guard:
    """An approved query whose first column of the first row must equal ``expect``.

    ``when`` says whether it is checked before the statements, after them
    (inside the same transaction), or both.
    """

    sql: str
    params: tuple[Any, ...] = ()
    expect: Any = True
    when: str = "before"

    def __post_init__(self) -> None:
        _check_sql(self.sql, "guard", InvalidInput)
        object.__setattr__(self, "params", _check_params(self.params, "guard", InvalidInput))
        _check_scalar(self.expect, "guard.expect", InvalidInput)
        if self.when not in GUARD_WHEN:
            raise InvalidInput(f"guard.when must be one of {', '.join(GUARD_WHEN)}")

    def to_claim(self) -> dict[str, Any]:
        """The guard as it appears in the ``change`` claim."""
        return {
            "sql": self.sql,
            "params": list(self.params),
            "expect": self.expect,
            "when": self.when,
        }


@dataclass(frozen=True)
class Change:
    """The exact approved work of a marque; ``change_cid`` names it (DESIGN §8).

    ``access`` is ``"read_only"`` for a change approved as a read (DESIGN §11.3),
    else None (read-write, the default, absent from the claim and the CID).
    """

    statements: tuple[Statement, ...]
    guards: tuple[Guard, ...] = ()
    isolation: str = "read_committed"
    statement_timeout_ms: int | None = None
    access: str | None = None
    _cid: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        statements = tuple(self.statements)
        guards = tuple(self.guards)
        if not statements:
            raise InvalidInput("a change needs at least one statement")
        if not all(isinstance(s, Statement) for s in statements):
            raise InvalidInput("change.statements must be Statement objects")
        if not all(isinstance(g, Guard) for g in guards):
            raise InvalidInput("change.guards must be Guard objects")
        _check_isolation(self.isolation, InvalidInput)
        _check_timeout(self.statement_timeout_ms, InvalidInput)
        _check_access(self.access, InvalidInput)
        object.__setattr__(self, "statements", statements)
        object.__setattr__(self, "guards", guards)
        # Computing the CID also proves the whole change has one canonical JSON form.
        object.__setattr__(self, "_cid", cid(self._preimage()))

    def _preimage(self) -> dict[str, Any]:
        preimage: dict[str, Any] = {
            "statements": [s.to_claim() for s in self.statements],
            "guards": [g.to_claim() for g in self.guards],
            "isolation": self.isolation,
            "statement_timeout_ms": self.statement_timeout_ms,
        }
        # Only when set: every change issued before ``access`` existed keeps its CID.
        if self.access is not None:
            preimage["access"] = self.access
        return preimage

    @property
    def read_only(self) -> bool:
        """Whether the database must refuse every write of this change (DESIGN §11.3)."""
        return self.access == READ_ONLY

    @property
    def change_cid(self) -> str:
        """``cid(self.to_claim(), exclude="change_cid")`` — what approval signs."""
        return self._cid

    def to_claim(self) -> dict[str, Any]:
        """The ``change`` claim, including its own ``change_cid``."""
        claim = self._preimage()
        claim["change_cid"] = self._cid
        return claim

    @classmethod
    def from_claim(cls, data: Any) -> Change:
        """Read a ``change`` claim, strictly, and check it hashes to its ``change_cid``.

        Raises :class:`MarqueInvalid` for any deviation from the shape
        :meth:`to_claim` produces, or when the recomputed CID differs.
        """
        data = _check_keys(data, _CHANGE_KEYS, "change", _CHANGE_OPTIONAL_KEYS)
        raw_statements = data["statements"]
        if not isinstance(raw_statements, list) or not raw_statements:
            raise MarqueInvalid("change.statements must be a non-empty list")
        statements = []
        for index, item in enumerate(raw_statements):
            where = f"change.statements[{index}]"
            item = _check_keys(item, _STATEMENT_KEYS, where, _STATEMENT_OPTIONAL_KEYS)
            sql = _check_sql(item["sql"], where, MarqueInvalid)
            params = _check_params(item["params"], where, MarqueInvalid)
            # Present means a count, exactly: null is not a spelling of "absent".
            if "expect_rows" in item and item["expect_rows"] is None:
                raise MarqueInvalid(f"{where}.expect_rows must be a number when present")
            _check_expect_rows(item.get("expect_rows"), MarqueInvalid)
            statements.append(Statement(sql, params, item.get("expect_rows")))
        raw_guards = data["guards"]
        if not isinstance(raw_guards, list):
            raise MarqueInvalid("change.guards must be a list")
        guards = []
        for index, item in enumerate(raw_guards):
            where = f"change.guards[{index}]"
            item = _check_keys(item, _GUARD_KEYS, where)
            sql = _check_sql(item["sql"], where, MarqueInvalid)
            params = _check_params(item["params"], where, MarqueInvalid)
            _check_scalar(item["expect"], f"{where}.expect", MarqueInvalid)
            if item["when"] not in GUARD_WHEN:
                raise MarqueInvalid(f"{where}.when must be one of {', '.join(GUARD_WHEN)}")
            guards.append(Guard(sql, params, item["expect"], item["when"]))
        _check_isolation(data["isolation"], MarqueInvalid)
        _check_timeout(data["statement_timeout_ms"], MarqueInvalid)
        # Present means read_only, exactly: "read_write" (or null) is not a spelling of
        # the default, or one change would have two claims and two CIDs.
        access = data.get("access")
        if "access" in data and access not in ACCESS_MODES:
            raise MarqueInvalid(f"change.access must be {READ_ONLY!r} when present, got {access!r}")
        try:
            change = cls(
                tuple(statements), tuple(guards), data["isolation"], data["statement_timeout_ms"],
                access,
            )
        except InvalidInput as exc:
            raise MarqueInvalid(f"change: {exc.message}") from exc
        if data["change_cid"] != change.change_cid:
            raise MarqueInvalid("change_cid does not match the change it names")
        return change


def _check_isolation(value: Any, error: type[MarqueError]) -> None:
    if not isinstance(value, str) or value not in ISOLATION_LEVELS:
        raise error(f"change.isolation must be one of {', '.join(ISOLATION_LEVELS)}")


def _check_timeout(value: Any, error: type[MarqueError]) -> None:
    if value is None:
        return
    if not is_json_int(value) or value < 1 or value > MAX_SAFE_INT:
        raise error("change.statement_timeout_ms must be a positive integer or null")


def _check_access(value: Any, error: type[MarqueError]) -> None:
    if value is None:
        return
    if not isinstance(value, str) or value not in ACCESS_MODES:
        raise error(f"change.access must be {READ_ONLY!r} or absent, got {value!r}")


_EFFECT_CHANGE_KEYS = frozenset({"effect_preview_cid", "change_cid"})


@dataclass(frozen=True)
class EffectSetChange:
    """An approved Effect Set (DESIGN §7): exactly the preview named by ``effect_preview_cid``.

    The claim is ``{effect_preview_cid, change_cid}``, ``change_cid`` being the
    CID of the claim without it (DESIGN §8), as for a statement change. The
    preview itself (every row's before and after, the row keys) is content
    addressed in the Pilot's ledger; the Pilot refuses a marque whose preview it
    does not hold. The statement-change attributes the execution path reads
    have their neutral values: no statements, no guards, read-write.
    """

    effect_preview_cid: str
    _cid: str = field(init=False, repr=False, compare=False)

    #: An Effect Set never asks for another statement timeout than the Pilot's.
    statement_timeout_ms: ClassVar[None] = None
    access: ClassVar[None] = None
    read_only: ClassVar[bool] = False

    def __post_init__(self) -> None:
        from marque.cid import is_cid

        if not isinstance(self.effect_preview_cid, str) or not is_cid(self.effect_preview_cid):
            raise InvalidInput("effect_preview_cid must be a CID (sha256: and 64 hex digits)")
        object.__setattr__(self, "_cid", cid({"effect_preview_cid": self.effect_preview_cid}))

    @property
    def change_cid(self) -> str:
        """``cid({effect_preview_cid})`` — what approval signs."""
        return self._cid

    def to_claim(self) -> dict[str, Any]:
        """The ``change`` claim: ``{effect_preview_cid, change_cid}``."""
        return {"effect_preview_cid": self.effect_preview_cid, "change_cid": self._cid}

    @classmethod
    def from_claim(cls, data: Any) -> EffectSetChange:
        """Read an Effect Set ``change`` claim strictly (:class:`MarqueInvalid` otherwise)."""
        data = _check_keys(data, _EFFECT_CHANGE_KEYS, "change")
        try:
            change = cls(data["effect_preview_cid"])
        except InvalidInput as exc:
            raise MarqueInvalid(f"change: {exc.message}") from exc
        if data["change_cid"] != change.change_cid:
            raise MarqueInvalid("change_cid does not match the change it names")
        return change


#: What a marque's ``change`` claim may hold.
AnyChange = Change | EffectSetChange


def change_from_claim(data: Any) -> AnyChange:
    """A statement :class:`Change` or an :class:`EffectSetChange`, by the claim's shape
    (an Effect Set names ``effect_preview_cid``; a statement change has ``statements``)."""
    if isinstance(data, dict) and "effect_preview_cid" in data:
        return EffectSetChange.from_claim(data)
    return Change.from_claim(data)
