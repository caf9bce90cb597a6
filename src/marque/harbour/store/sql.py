"""The Harbourmaster store's SQL, written once for SQLite and PostgreSQL.

Engines supply how to connect and open a write transaction (hooks on the
subclasses in ``sqlite.py`` and ``postgres.py``); the statements use only what
both share — ``INSERT … ON CONFLICT DO NOTHING RETURNING``, ``UPDATE …
RETURNING``, partial indexes — with ``?`` placeholders.

This module holds the store's lifecycle (create, open, migrate), the logbook,
principals, routing configs and Pilots; requests, Checkpoints, Resolutions and
reports are in ``request_sql.py``; the console's sessions in ``session_sql.py``; webhook
endpoints and the outbox in ``webhook_sql.py``; signing in through an identity provider in
``oidc_sql.py``.

The logbook's appends are serialised by its head row: the first statement of
an append is ``UPDATE logbook_head SET seq = seq + 1 … RETURNING seq, hash``,
which takes that row's lock until the transaction ends, and the last is a
compare-and-set of the head's hash on the ``seq`` it took. Two processes
appending at once therefore build one chain, one after the other; the
appending statements come last in each transaction so the lock is held
briefly.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import time
import uuid
from dataclasses import replace
from typing import Any, Self

from marque.errors import (
    Conflict,
    HarbourUnavailable,
    InvalidInput,
    NotFound,
    ReportKeyChanged,
    Unauthenticated,
)
from marque.harbour.principals import (
    Principal,
    Role,
    hash_token,
    hashes_equal,
    key_thumbprint,
    mint_token,
    parse_roles,
)
from marque.harbour.store import schema
from marque.harbour.store.base import AdoptedConfig, LogbookEntry, PilotRecord
from marque.harbour.store.columns import canonical_json, loads
from marque.harbour.store.oidc_sql import OidcRecords
from marque.harbour.store.request_sql import Journal, RequestRecords
from marque.harbour.store.session_sql import SessionRecords
from marque.harbour.store.webhook_sql import WebhookRecords
from marque.logbook.chain import GENESIS, entry_hash
from marque.storage.migrations import MetaTableSchema, migrate
from marque.storage.tx import Tx

#: The longest principal name accepted.
MAX_NAME_BYTES = 128


_PRINCIPAL_COLUMNS = "name, roles, public_jwk, revoked_at, created_at, id, key_thumbprint"
_LOGBOOK_COLUMNS = "seq, at, kind, actor, subject, body, prev_hash, hash"


def _principal(row: tuple[Any, ...]) -> Principal:
    return Principal(name=row[0], roles=parse_roles(loads(row[1])), public_jwk=loads(row[2]),
                     revoked_at=row[3], created_at=row[4], id=row[5], key_thumbprint=row[6])


#: The one member of the body an entry is read back with when its stored body is not JSON.
UNREADABLE_BODY = "unreadable_body"


def _entry(row: tuple[Any, ...]) -> LogbookEntry:
    return LogbookEntry(seq=int(row[0]), at=row[1], kind=row[2], actor=row[3], subject=row[4],
                        body=_logbook_body(row[5]), prev_hash=row[6], hash=row[7])


def _logbook_body(text: str) -> Any:
    """A stored entry body; one damaged in the store so that it is no longer JSON is read back
    as ``{"unreadable_body": text}``. Its hash then fails where it stands, so verification
    names its ``seq`` — a read that raised would hide where the chain breaks (found by the
    reliability campaign, row 12: a flipped byte crashed ``logbook verify``)."""
    try:
        return loads(text)
    except (ValueError, RecursionError):
        return {UNREADABLE_BODY: text}


def _pilot(row: tuple[Any, ...]) -> PilotRecord:
    return PilotRecord(pilot_id=row[0], url=row[1], incarnation=row[2], targets=loads(row[3]),
                       registered_at=row[4], last_seen=row[5], dialects=loads(row[6]) or {},
                       report_key=loads(row[7]))


_PILOT_COLUMNS = ("pilot_id, url, incarnation, targets, registered_at, last_seen, dialects, "
                  "report_key")


class SqlHarbourStore(OidcRecords, SessionRecords, WebhookRecords, RequestRecords):
    """The store's behaviour over any engine that provides :meth:`transaction`."""

    #: ``sqlite`` or ``postgres``: which list of :data:`schema.MIGRATIONS` applies.
    engine: str

    def __init__(self) -> None:
        self.clock = time.time

    # -- dialect hooks --------------------------------------------------------

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction that commits on success and rolls back on error."""

    def reading(self) -> contextlib.AbstractContextManager[Tx]:
        """A transaction that only reads."""
        return self.transaction()

    @abc.abstractmethod
    def _has_schema(self) -> bool:
        """Whether the store's tables exist."""

    def _now(self, now: float | None) -> float:
        return float(self.clock() if now is None else now)

    # -- lifecycle ------------------------------------------------------------

    def _initialise(self, now: float, upto: int) -> None:
        """Create the schema up to version ``upto`` and write the store's identity, once."""
        if self._has_schema():
            raise Conflict("a Harbourmaster store already exists here; refusing to overwrite "
                           "it (open it instead, or choose another location)")
        harbour_id = "hb_" + uuid.uuid4().hex
        with self.transaction() as tx:
            for index in range(upto):
                self._run_migration(tx, index, now)
            for key, value in (("schema_version", str(upto)), ("harbour_id", harbour_id),
                               ("created_at", repr(now)), ("routing_config_cid", "")):
                tx.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
            tx.execute("INSERT INTO logbook_head (id, seq, hash, at) VALUES (1, 0, ?, NULL)",
                       (GENESIS,))

    def _run_migration(self, tx: Tx, index: int, now: float) -> None:
        """The statements and steps taking the schema from version ``index`` to the next."""
        for statement in schema.MIGRATIONS[self.engine][index]:
            if isinstance(statement, schema.Step):
                getattr(self, f"_step_{statement.name}")(tx, now)
            else:
                tx.execute(statement)

    def _migrate(self) -> None:
        """Bring an older store's schema up to date (forward only), exactly once
        (:func:`marque.storage.migrations.migrate`); refuses a newer store."""
        migrate(_StoreSchema(self), self.reading, self.transaction)

    def _load_identity(self) -> None:
        with self.reading() as tx:
            meta = dict(tx.execute("SELECT key, value FROM meta"))
        if "harbour_id" not in meta:
            raise HarbourUnavailable("this Harbourmaster store has lost its identity (no "
                                     "harbour_id in its meta table); restore it from a backup")
        self.harbour_id = meta["harbour_id"]
        self.schema_version = int(meta["schema_version"])

    def _created(self, now: float | None = None, upto: int = schema.LATEST) -> Self:
        try:
            self._initialise(self._now(now), upto)
            if upto == schema.LATEST:
                self._migrate()
            self._load_identity()
        except BaseException:
            self.close()
            raise
        return self

    def _opened(self) -> Self:
        try:
            if not self._has_schema():
                raise NotFound("no Harbourmaster store here; create one with "
                               "`marque harbour init`")
            self._migrate()
            self._load_identity()
        except BaseException:
            self.close()
            raise
        return self

    # -- logbook ----------------------------------------------------------------

    def _append_tx(self, tx: Tx, kind: str, actor: str, subject: str, body: dict[str, Any],
                   now: float) -> LogbookEntry:
        """Append one entry inside the caller's transaction (see the module docstring)."""
        head = tx.one("UPDATE logbook_head SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash")
        if head is None:
            raise HarbourUnavailable("the logbook has no head row: the store is damaged")
        seq, prev_hash = int(head[0]), head[1]
        entry = {"seq": seq, "at": now, "kind": kind, "actor": actor, "subject": subject,
                 "body": body, "prev_hash": prev_hash}
        digest = entry_hash(entry)
        tx.execute(f"INSERT INTO logbook ({_LOGBOOK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (seq, now, kind, actor, subject, canonical_json(body), prev_hash, digest))
        moved = tx.execute(
            "UPDATE logbook_head SET hash = ?, at = ? WHERE id = 1 AND seq = ? AND hash = ? "
            "RETURNING seq", (digest, now, seq, prev_hash))
        if not moved:  # cannot happen while the head row is locked; refuse rather than fork
            raise Conflict("the logbook head moved during an append; nothing was written")
        return LogbookEntry(seq=seq, at=now, kind=kind, actor=actor, subject=subject,
                            body=loads(canonical_json(body)), prev_hash=prev_hash, hash=digest)

    def append(self, kind: str, actor: str, subject: str, body: dict[str, Any],
               now: float | None = None) -> LogbookEntry:
        at = self._now(now)
        with self.transaction() as tx:
            return self._append_tx(tx, kind, actor, subject, body, at)

    def logbook_entries(self, after: int = 0, limit: int = 100,
                        kind_prefix: str = "") -> list[LogbookEntry]:
        # substr, not LIKE: SQLite's LIKE ignores case, and a prefix may hold '_' or '%'.
        with self.reading() as tx:
            rows = tx.execute(
                f"SELECT {_LOGBOOK_COLUMNS} FROM logbook WHERE seq > ? "
                "AND substr(kind, 1, ?) = ? ORDER BY seq LIMIT ?",
                (int(after), len(kind_prefix), kind_prefix, int(limit)))
        return [_entry(row) for row in rows]

    def logbook_of(self, subject: str, limit: int = 1000, *,
                   after: int = 0) -> list[LogbookEntry]:
        with self.reading() as tx:
            rows = tx.execute(
                f"SELECT {_LOGBOOK_COLUMNS} FROM logbook WHERE subject = ? AND seq > ? "
                "ORDER BY seq LIMIT ?", (subject, int(after), int(limit)))
        return [_entry(row) for row in rows]

    def logbook_head(self) -> dict[str, Any]:
        with self.reading() as tx:
            row = tx.one("SELECT seq, hash, at FROM logbook_head WHERE id = 1")
        if row is None:
            raise HarbourUnavailable("the logbook has no head row: the store is damaged")
        return {"seq": int(row[0]), "hash": row[1], "at": row[2]}

    # -- principals ----------------------------------------------------------------

    def _step_backfill_key_thumbprints(self, tx: Tx, now: float) -> None:
        """Schema 6: the thumbprint of every registered key. Unrevoked principals that
        share one keep it only for the oldest of them; each later one is revoked here, in
        the migration's transaction, with a ``finding.principal_key_shared`` entry — the
        unique index that follows would refuse them, and leaving one without its
        thumbprint would let it approve its twin's requests."""
        rows = tx.execute("SELECT id, name, public_jwk, revoked_at FROM principals "
                          "WHERE public_jwk IS NOT NULL ORDER BY created_at, id")
        holders: dict[str, str] = {}
        for principal_id, name, jwk_text, revoked_at in rows:
            digest = _stored_thumbprint(loads(jwk_text))
            if digest is None:
                continue
            tx.execute("UPDATE principals SET key_thumbprint = ? WHERE id = ?",
                       (digest, principal_id))
            if revoked_at is not None:
                continue
            if digest not in holders:
                holders[digest] = name
                continue
            tx.execute("UPDATE principals SET revoked_at = ? WHERE id = ?", (now, principal_id))
            self._append_tx(tx, "finding.principal_key_shared", "marque", name, {
                "name": name, "key_thumbprint": digest, "holder": holders[digest],
                "revoked": True}, now)

    def add_principal(self, name: str, roles: list[str] | list[Role], *,
                      public_jwk: dict[str, Any] | None = None, actor: str,
                      now: float | None = None) -> tuple[Principal, str]:
        _check_name(name)
        parsed = parse_roles(roles)
        digest = key_thumbprint(public_jwk)
        at = self._now(now)
        token = mint_token()
        role_names = sorted(r.value for r in parsed)
        principal_id = "pr_" + uuid.uuid4().hex
        with self.transaction() as tx:
            # The partial unique indexes decide: one unrevoked principal per name, and per
            # key thumbprint. The reads after a refusal only say which one refused.
            added = tx.execute(
                "INSERT INTO principals (id, name, token_hash, roles, public_jwk, "
                "key_thumbprint, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING RETURNING id",
                (principal_id, name, hash_token(token), canonical_json(role_names),
                 canonical_json(public_jwk), digest, at))
            if not added:
                if tx.one("SELECT 1 FROM principals WHERE name = ? AND revoked_at IS NULL",
                          (name,)) is not None:
                    raise Conflict(f"a principal named {name!r} already exists",
                                   detail={"name": name})
                raise _key_taken(tx, digest)
            self._append_tx(tx, "principal.added", actor, name,
                            {"name": name, "id": principal_id, "roles": role_names,
                             "public_jwk": public_jwk, "key_thumbprint": digest}, at)
        return Principal(name=name, roles=parsed, public_jwk=public_jwk, created_at=at,
                         id=principal_id, key_thumbprint=digest), token

    def authenticate(self, token: str) -> Principal:
        if not isinstance(token, str) or not token:
            raise Unauthenticated("no token given")
        digest = hash_token(token)
        with self.reading() as tx:
            row = tx.one(f"SELECT token_hash, {_PRINCIPAL_COLUMNS} FROM principals "
                         "WHERE token_hash = ?", (digest,))
        # The index found the row; the constant-time comparison is what decides.
        if row is None or not hashes_equal(row[0], digest):
            raise Unauthenticated("the token is not one this Harbourmaster issued")
        principal = _principal(row[1:])
        if principal.revoked:
            raise Unauthenticated("the token was revoked")
        return principal

    def revoke_principal(self, name: str, *, actor: str, now: float | None = None) -> Principal:
        at = self._now(now)
        with self.transaction() as tx:
            row = tx.one(
                "UPDATE principals SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL "
                f"RETURNING {_PRINCIPAL_COLUMNS}", (at, name))
            if row is None:
                return self._get_principal_tx(tx, name)  # already revoked: idempotent
            self._append_tx(tx, "principal.revoked", actor, name,
                            {"name": name, "id": row[5]}, at)
        return _principal(row)

    def rotate_principal(self, name: str, *, public_jwk: dict[str, Any] | None = None,
                         actor: str, now: float | None = None) -> tuple[Principal, str]:
        at = self._now(now)
        token = mint_token()
        digest = key_thumbprint(public_jwk)
        key_sql = "" if public_jwk is None else ", public_jwk = ?, key_thumbprint = ?"
        key_params: tuple[Any, ...] = (
            () if public_jwk is None else (canonical_json(public_jwk), digest))
        try:
            with self.transaction() as tx:
                row = tx.one(
                    f"UPDATE principals SET token_hash = ?{key_sql} WHERE name = ? "
                    f"AND revoked_at IS NULL RETURNING {_PRINCIPAL_COLUMNS}",
                    (hash_token(token), *key_params, name))
                if row is None:
                    raise self._no_live_principal(tx, name)
                principal = _principal(row)
                ended = tx.execute(
                    "UPDATE console_sessions SET revoked_at = ? WHERE principal_id = ? "
                    "AND revoked_at IS NULL RETURNING session_hash", (at, principal.id))
                body: dict[str, Any] = {"name": name, "id": principal.id,
                                        "key_rotated": public_jwk is not None,
                                        "sessions_ended": len(ended)}
                if public_jwk is not None:
                    body.update(public_jwk=public_jwk, key_thumbprint=digest)
                self._append_tx(tx, "principal.rotated", actor, name, body, at)
        except Conflict as exc:
            raise self._key_conflict(digest, exc) from exc
        return principal, token

    def set_roles(self, name: str, roles: list[str] | list[Role], *, actor: str,
                  now: float | None = None) -> Principal:
        parsed = parse_roles(roles)
        role_names = sorted(r.value for r in parsed)
        at = self._now(now)
        with self.transaction() as tx:
            # The no-op update takes the row's lock, so ``previous`` is what this replaces.
            before = tx.one("UPDATE principals SET roles = roles WHERE name = ? "
                            "AND revoked_at IS NULL RETURNING roles", (name,))
            if before is None:
                raise self._no_live_principal(tx, name)
            row = tx.one(f"UPDATE principals SET roles = ? WHERE name = ? AND revoked_at IS NULL "
                         f"RETURNING {_PRINCIPAL_COLUMNS}", (canonical_json(role_names), name))
            assert row is not None  # the row is locked by this transaction
            previous = sorted(loads(before[0]))
            if previous != role_names:
                self._append_tx(tx, "principal.roles_set", actor, name,
                                {"name": name, "id": row[5], "roles": role_names,
                                 "previous": previous}, at)
        return _principal(row)

    def _no_live_principal(self, tx: Tx, name: str) -> NotFound:
        """The error for an operation on a name no unrevoked principal holds."""
        self._get_principal_tx(tx, name)  # NotFound when there never was one
        return NotFound(f"principal {str(name)[:128]!r} is revoked: add it again as a new "
                        "principal (`harbour principal add`)", detail={"name": name[:128],
                                                                      "revoked": True})

    def _key_conflict(self, digest: str | None, exc: Conflict) -> Conflict:
        """A unique violation of a key update, said as who holds the key."""
        if digest is None:
            return exc
        with self.reading() as tx:
            return _key_taken(tx, digest)

    def get_principal(self, name: str) -> Principal:
        with self.reading() as tx:
            return self._get_principal_tx(tx, name)

    def _get_principal_tx(self, tx: Tx, name: str) -> Principal:
        # The unrevoked principal of that name, else the latest one (revoked).
        row = tx.one(f"SELECT {_PRINCIPAL_COLUMNS} FROM principals WHERE name = ? "
                     "ORDER BY CASE WHEN revoked_at IS NULL THEN 0 ELSE 1 END, "
                     "created_at DESC, id DESC LIMIT 1", (name,))
        if row is None:
            raise NotFound(f"no principal named {str(name)[:128]!r}")
        return _principal(row)

    def list_principals(self) -> list[Principal]:
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_PRINCIPAL_COLUMNS} FROM principals "
                              "ORDER BY name, created_at, id")
        return [_principal(row) for row in rows]

    def set_public_key(self, name: str, public_jwk: dict[str, Any] | None, *, actor: str,
                       now: float | None = None) -> Principal:
        digest = key_thumbprint(public_jwk)
        at = self._now(now)
        try:
            with self.transaction() as tx:
                row = tx.one(f"UPDATE principals SET public_jwk = ?, key_thumbprint = ? "
                             f"WHERE name = ? AND revoked_at IS NULL "
                             f"RETURNING {_PRINCIPAL_COLUMNS}",
                             (canonical_json(public_jwk), digest, name))
                if row is None:
                    raise self._no_live_principal(tx, name)
                self._append_tx(tx, "principal.key_set", actor, name,
                                {"name": name, "public_jwk": public_jwk,
                                 "key_thumbprint": digest}, at)
        except Conflict as exc:
            raise self._key_conflict(digest, exc) from exc
        return _principal(row)

    # -- routing configs ------------------------------------------------------------

    def adopt_routing_config(self, config_cid: str, source: str, *, actor: str,
                             now: float | None = None) -> bool:
        at = self._now(now)
        with self.transaction() as tx:
            # Lock the pointer first, so two adoptions at once take turns.
            tx.execute("UPDATE meta SET value = value WHERE key = 'routing_config_cid'")
            current = tx.one("SELECT value FROM meta WHERE key = 'routing_config_cid'")
            previous = current[0] if current is not None and current[0] else None
            if previous == config_cid:
                return False
            tx.execute("INSERT INTO routing_configs (config_cid, source, adopted_at, adopted_by) "
                       "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       (config_cid, source, at, actor))
            tx.execute("INSERT INTO meta (key, value) VALUES ('routing_config_cid', ?) "
                       "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (config_cid,))
            self._append_tx(tx, "config.adopted", actor, config_cid,
                            {"config_cid": config_cid,
                             "previous": previous}, at)
        return True

    def current_routing_config(self) -> AdoptedConfig | None:
        with self.reading() as tx:
            row = tx.one(
                "SELECT c.config_cid, c.source, c.adopted_at, c.adopted_by FROM meta m "
                "JOIN routing_configs c ON c.config_cid = m.value "
                "WHERE m.key = 'routing_config_cid'")
        return None if row is None else AdoptedConfig(*row)

    def get_routing_config(self, config_cid: str) -> AdoptedConfig:
        with self.reading() as tx:
            row = tx.one("SELECT config_cid, source, adopted_at, adopted_by FROM routing_configs "
                         "WHERE config_cid = ?", (config_cid,))
        if row is None:
            raise NotFound(f"no routing config {str(config_cid)[:80]} was ever adopted here")
        return AdoptedConfig(*row)

    # -- pilots ------------------------------------------------------------------------

    def register_pilot(self, pilot_id: str, url: str, incarnation: str, targets: list[str], *,
                       actor: str | None = None, now: float | None = None,
                       dialects: dict[str, str] | None = None,
                       report_key: dict[str, Any] | None = None) -> str | None:
        at = self._now(now)
        who = actor or pilot_id
        if dialects is not None and (not isinstance(dialects, dict)
                                     or set(dialects) != set(targets)):
            raise InvalidInput("a Pilot's dialects must name exactly its targets")
        if report_key is not None and not isinstance(report_key, dict):
            raise InvalidInput("a Pilot's report key must be a public JWK object")
        with self.transaction() as tx:
            # Lock the Pilot's row (if any) first: registrations of one Pilot take turns.
            tx.execute("UPDATE pilots SET last_seen = last_seen WHERE pilot_id = ?", (pilot_id,))
            row = tx.one(f"SELECT {_PILOT_COLUMNS} FROM pilots WHERE pilot_id = ?",
                         (pilot_id,))
            held = None if row is None else _pilot(row)
            previous = None if held is None else held.incarnation
            key = report_key if report_key is not None or held is None else held.report_key
            if held is not None and held.report_key is not None and key != held.report_key:
                # Whoever holds the Pilot's token could otherwise register a key of their
                # own and sign outcomes in its name: only an admin replaces a report key.
                # The attempt is kept (a finding); nothing of the registration is.
                self._flush_tx(tx, [("finding.pilot_report_key_refused", who, pilot_id, {
                    "pilot_id": pilot_id, "report_key": held.report_key,
                    "offered_report_key": key, "url": url, "incarnation": incarnation})], at)
                refused = ReportKeyChanged(
                    f"Pilot {pilot_id} registered a report key other than the one this "
                    "Harbourmaster holds for it, so the registration is refused; if its "
                    "home made a new key, an admin accepts it with `marque harbour pilot "
                    f"accept-key {pilot_id} --key PUBLIC_JWK --reason TEXT`",
                    detail={"pilot_id": pilot_id,
                            "report_key_kid": held.report_key.get("kid"),
                            "offered_kid": None if key is None else key.get("kid")})
            else:
                refused = None
                self._register_tx(tx, held, pilot_id, url, incarnation, targets, dialects,
                                  key, who, at)
        if refused is not None:
            raise refused
        return previous

    def _register_tx(self, tx: Tx, held: PilotRecord | None, pilot_id: str, url: str,
                     incarnation: str, targets: list[str], dialects: dict[str, str] | None,
                     key: dict[str, Any] | None, who: str, at: float) -> None:
        previous = None if held is None else held.incarnation
        if held is not None and (held.url, held.incarnation, list(held.targets),
                                 held.dialects, held.report_key) == (
                url, incarnation, list(targets), dict(dialects or {}), key):
            # Nothing new about the Pilot: liveness is the registry's, not the logbook's.
            tx.execute("UPDATE pilots SET last_seen = ? WHERE pilot_id = ?", (at, pilot_id))
            return
        tx.execute(
            f"INSERT INTO pilots ({_PILOT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (pilot_id) DO UPDATE SET "
            "url = excluded.url, incarnation = excluded.incarnation, "
            "targets = excluded.targets, last_seen = excluded.last_seen, "
            "dialects = excluded.dialects, report_key = excluded.report_key",
            (pilot_id, url, incarnation, canonical_json(list(targets)), at, at,
             canonical_json(dialects), canonical_json(key)))
        journal: Journal = [("pilot.registered", who, pilot_id, {
            "pilot_id": pilot_id, "url": url, "incarnation": incarnation,
            "targets": list(targets), "previous_incarnation": previous,
            **({} if dialects is None else {"dialects": dict(dialects)}),
            **({} if key is None else {"report_key": key}),
            **({} if held is None else {"changed": _changed(held, url, incarnation,
                                                             targets, dialects, key)})})]
        if previous is not None and previous != incarnation:
            self._incarnation_changed_tx(tx, pilot_id, previous, incarnation, journal,
                                         actor=who, now=at)
        self._flush_tx(tx, journal, at)

    def accept_report_key(self, pilot_id: str, report_key: dict[str, Any], *, actor: str,
                          reason: str, now: float | None = None) -> PilotRecord:
        at = self._now(now)
        with self.transaction() as tx:
            # Lock the row as a registration does, so the two take turns.
            tx.execute("UPDATE pilots SET last_seen = last_seen WHERE pilot_id = ?", (pilot_id,))
            row = tx.one(f"SELECT {_PILOT_COLUMNS} FROM pilots WHERE pilot_id = ?",
                         (pilot_id,))
            if row is None:
                raise NotFound(f"no Pilot {str(pilot_id)[:128]!r} is registered")
            held = _pilot(row)
            tx.execute("UPDATE pilots SET report_key = ? WHERE pilot_id = ?",
                       (canonical_json(report_key), pilot_id))
            self._flush_tx(tx, [("pilot.report_key_accepted", actor, pilot_id, {
                "pilot_id": pilot_id, "previous_report_key": held.report_key,
                "report_key": report_key, "reason": reason})], at)
        return replace(held, report_key=report_key)

    def get_pilot(self, pilot_id: str) -> PilotRecord:
        with self.reading() as tx:
            row = tx.one(f"SELECT {_PILOT_COLUMNS} FROM pilots WHERE pilot_id = ?",
                         (pilot_id,))
        if row is None:
            raise NotFound(f"no Pilot {str(pilot_id)[:128]!r} is registered")
        return _pilot(row)

    def list_pilots(self) -> list[PilotRecord]:
        with self.reading() as tx:
            rows = tx.execute(f"SELECT {_PILOT_COLUMNS} FROM pilots ORDER BY pilot_id")
        return [_pilot(row) for row in rows]


def _stored_thumbprint(jwk: Any) -> str | None:
    """The thumbprint of a key an older Marque stored without checking it; one that has
    none (not a readable JWK) is known by the digest of its JSON, so it too is unique."""
    if not isinstance(jwk, dict):
        return None
    try:
        return key_thumbprint(jwk)
    except InvalidInput:
        return "jwk:" + hashlib.sha256(str(canonical_json(jwk)).encode("utf-8")).hexdigest()


def _key_taken(tx: Tx, digest: str | None) -> Conflict:
    """``conflict`` for a key an unrevoked principal already holds (named, for the admin)."""
    row = None if digest is None else tx.one(
        "SELECT name FROM principals WHERE key_thumbprint = ? AND revoked_at IS NULL", (digest,))
    holder = None if row is None else row[0]
    return Conflict(
        f"principal {holder!r} already holds this key (thumbprint {digest}): one key is one "
        "principal, so nobody can approve their own request under a second name",
        detail={"key_thumbprint": digest, "holder": holder, "reason": "key_taken"})


def _changed(held: PilotRecord, url: str, incarnation: str, targets: list[str],
             dialects: dict[str, str] | None, key: dict[str, Any] | None) -> list[str]:
    """What a registration changes about a Pilot already registered, by field name."""
    now = {"url": url, "incarnation": incarnation, "targets": list(targets),
           "dialects": dict(dialects or {}), "report_key": key}
    before = {"url": held.url, "incarnation": held.incarnation, "targets": list(held.targets),
              "dialects": held.dialects, "report_key": held.report_key}
    return [name for name in now if now[name] != before[name]]


def _check_name(name: str) -> None:
    if (not isinstance(name, str) or not name or len(name.encode("utf-8")) > MAX_NAME_BYTES
            or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name)):
        raise InvalidInput(f"a principal's name must be 1 to {MAX_NAME_BYTES} bytes of text "
                           "without control characters")


class _StoreSchema(MetaTableSchema):
    """The store's versions (:data:`schema.MIGRATIONS`), kept in its ``meta`` table."""

    latest = schema.LATEST

    def __init__(self, store: SqlHarbourStore) -> None:
        self._store = store

    def step(self, conn: Tx, index: int) -> None:
        self._store._run_migration(conn, index, self._store._now(None))

    def newer(self, found: int) -> Exception:
        return HarbourUnavailable(
            f"this Harbourmaster store has schema version {found}, newer than the "
            f"{schema.LATEST} this Marque knows; upgrade Marque to use it",
            detail={"schema_version": found})
