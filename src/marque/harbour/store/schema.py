"""The Harbourmaster store's schema: forward-only migrations for both engines.

``MIGRATIONS[engine][i]`` holds the statements that take a store from schema
version ``i`` to ``i + 1``; the version a store holds is the ``schema_version``
row of its ``meta`` table. A released migration is never edited: a change is a
new one appended.

Version 1 kept ``logical_request_scope`` unique across the whole table (a
column ``UNIQUE``), so an expired or rejected attempt blocked its logical
request forever — the failure ADR-038 describes. Version 2 scopes uniqueness
to the blocking states with a partial unique index, the sole race guard of
DESIGN §11.2, and rewrites no row's content: PostgreSQL drops the constraint;
SQLite, which cannot drop one, rebuilds the table by its documented
procedure (create, copy every column verbatim, drop, rename).

A step that SQL cannot express (version 6 computes key thumbprints) is a
:class:`Step`, run by the store inside the same migration transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The blocking states, spelled out as released: a later change of
# lifecycle.BLOCKING needs a new migration, never an edit of this one (a test
# pins the two equal).
BLOCKING_STATES_V2 = (
    "preparing", "awaiting_approval", "prepared", "executing", "verified", "reconciliation",
    "rolling_back", "rollback_failed",
)
_IN_BLOCKING_V2 = "(" + ", ".join(f"'{state}'" for state in BLOCKING_STATES_V2) + ")"
#: The partial index's predicate: a query must spell it exactly so to use the index.
ACTIVE_PREDICATE = f"state IN {_IN_BLOCKING_V2}"

_REQUEST_COLUMNS = """
    id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    principal TEXT NOT NULL,
    reason TEXT,
    pilot_id TEXT NOT NULL,
    target TEXT NOT NULL,
    change TEXT NOT NULL,
    budget TEXT NOT NULL,
    ttl_seconds BIGINT NOT NULL,
    change_cid TEXT NOT NULL,
    authority_scope_cid TEXT NOT NULL,
    logical_request_scope TEXT NOT NULL{scope_unique},
    intent_fingerprint TEXT NOT NULL,
    routing TEXT,
    preview TEXT,
    checkpoint_cid TEXT,
    marque_id TEXT,
    rolls_back TEXT,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL"""

#: The columns of ``requests`` as versions 1 and 2 released them, in table order (frozen:
#: version 2's table rebuild copies exactly these).
REQUEST_COLUMNS = (
    "id", "request_id", "principal", "reason", "pilot_id", "target", "change", "budget",
    "ttl_seconds", "change_cid", "authority_scope_cid", "logical_request_scope",
    "intent_fingerprint", "routing", "preview", "checkpoint_cid", "marque_id", "rolls_back",
    "state", "version", "created_at", "updated_at",
)

_REQUEST_INDEXES = [
    "CREATE INDEX requests_state ON requests (state, created_at)",
    "CREATE INDEX requests_principal ON requests (principal, created_at)",
    "CREATE INDEX requests_pilot ON requests (pilot_id, state)",
    "CREATE INDEX requests_marque ON requests (marque_id)",
    "CREATE INDEX requests_rolls_back ON requests (rolls_back)",
]

# Version 1, whole: the same for both engines (types both accept).
_V1 = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE principals (
        name TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL UNIQUE,
        roles TEXT NOT NULL,
        public_jwk TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION)""",
    "CREATE TABLE requests (" + _REQUEST_COLUMNS.format(scope_unique=" UNIQUE") + ")",
    *_REQUEST_INDEXES,
    """CREATE TABLE checkpoints (
        checkpoint_cid TEXT PRIMARY KEY,
        request TEXT NOT NULL,
        body TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX checkpoints_request ON checkpoints (request)",
    # One approver counts once per Checkpoint: a constraint, not a check in code.
    """CREATE TABLE resolutions (
        resolution_cid TEXT PRIMARY KEY,
        checkpoint_cid TEXT NOT NULL,
        approver TEXT NOT NULL,
        decision TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
        body TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        UNIQUE (checkpoint_cid, approver))""",
    """CREATE TABLE pilots (
        pilot_id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        incarnation TEXT NOT NULL,
        targets TEXT NOT NULL,
        registered_at DOUBLE PRECISION NOT NULL,
        last_seen DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE routing_configs (
        config_cid TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        adopted_at DOUBLE PRECISION NOT NULL,
        adopted_by TEXT NOT NULL)""",
    # Ingestion is idempotent on exactly this key (DESIGN §11.5).
    """CREATE TABLE reports (
        marque_id TEXT NOT NULL,
        nonce TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        status TEXT NOT NULL,
        body TEXT NOT NULL,
        request TEXT,
        received_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (marque_id, nonce, attempt, status))""",
    """CREATE TABLE logbook (
        seq BIGINT PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        kind TEXT NOT NULL,
        actor TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL)""",
    "CREATE INDEX logbook_kind ON logbook (kind, seq)",
    # The head every append moves by compare-and-set: one row, so appends from many
    # processes form one chain.
    """CREATE TABLE logbook_head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        hash TEXT NOT NULL,
        at DOUBLE PRECISION)""",
]

_ACTIVE_SCOPE_INDEX = (
    "CREATE UNIQUE INDEX requests_active_scope ON requests (logical_request_scope) "
    f"WHERE {ACTIVE_PREDICATE}"
)
_HISTORY_INDEX = "CREATE INDEX requests_scope ON requests (logical_request_scope, created_at)"

_columns = ", ".join(REQUEST_COLUMNS)

_V2_SQLITE = [
    "CREATE TABLE requests_v2 (" + _REQUEST_COLUMNS.format(scope_unique="") + ")",
    f"INSERT INTO requests_v2 ({_columns}) SELECT {_columns} FROM requests",
    "DROP TABLE requests",
    "ALTER TABLE requests_v2 RENAME TO requests",
    *_REQUEST_INDEXES,  # dropped with the old table
    _ACTIVE_SCOPE_INDEX,
    _HISTORY_INDEX,
]

_V2_POSTGRES = [
    # PostgreSQL's own name for the column constraint of version 1.
    "ALTER TABLE requests DROP CONSTRAINT requests_logical_request_scope_key",
    _ACTIVE_SCOPE_INDEX,
    _HISTORY_INDEX,
]

# Version 3: what the Harbourmaster's flow keeps beyond the request's identity — why a
# request ended (``failure``), the marque handed to its requester and when it expires,
# and each registered target's SQL dialect (routing classifies statements in it). Only
# columns are added, all nullable, so every existing row stays as it was. (The
# ``requests_marque`` index ingestion looks reports up by exists since version 1.)
_V3 = [
    "ALTER TABLE requests ADD COLUMN failure TEXT",
    "ALTER TABLE requests ADD COLUMN marque TEXT",
    "ALTER TABLE requests ADD COLUMN marque_expires_at DOUBLE PRECISION",
    "ALTER TABLE pilots ADD COLUMN dialects TEXT",
    "CREATE INDEX reports_request ON reports (request)",
]

#: The columns of ``requests`` as version 3 left them, in table order (frozen).
REQUEST_COLUMNS_V3 = (*REQUEST_COLUMNS, "failure", "marque", "marque_expires_at")

# Version 4: the web console's sessions (DESIGN §12). Kept in the store, not in one
# process, so every ``harbour serve`` sharing a PostgreSQL store knows every session.
# Only the SHA-256 of a session id is stored (a leaked store opens no session); the CSRF
# secret its forms are signed with is per session. A new table, so no row is touched.
_V4 = [
    """CREATE TABLE console_sessions (
        session_hash TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        csrf_secret TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION)""",
    "CREATE INDEX console_sessions_principal ON console_sessions (principal)",
    "CREATE INDEX console_sessions_expires ON console_sessions (expires_at)",
]

# Version 5: a request's own logbook entries, read by everyone who may see the request
# (its page and ``GET /v1/requests/{id}/logbook``) without walking the whole chain.
_V5 = ["CREATE INDEX logbook_subject ON logbook (subject, seq)"]


@dataclass(frozen=True)
class Step:
    """A migration step that is not one SQL statement: the store's method ``_step_<name>``
    runs it inside the migration's transaction (for values SQL cannot compute, such as a
    key's RFC 7638 thumbprint)."""

    name: str


# Version 6: a principal is a row with its own ``id``; its name is unique only among
# unrevoked principals (a revoked name may be added again as a new principal, and the old
# row stays, revoked, with its history), and so is its key's RFC 7638 thumbprint — two
# unrevoked principals can never hold one key, so nobody approves their own request
# under a second name. Console sessions point at the principal row, so a session of a
# revoked ``alice`` never wakes up as the new one's and a rotation can end them. A
# request records its requester's key thumbprint when it was asked, so a later key
# rotation cannot make an approval by that same key look like someone else's; and a
# Resolution records its approver's key thumbprint, unique per Checkpoint.
_PRINCIPALS_V6 = """CREATE TABLE principals_v6 (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        token_hash TEXT NOT NULL UNIQUE,
        roles TEXT NOT NULL,
        public_jwk TEXT,
        key_thumbprint TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION)"""
_LIVE_NAME_INDEX = ("CREATE UNIQUE INDEX principals_live_name ON principals (name) "
                    "WHERE revoked_at IS NULL")
_LIVE_KEY_INDEX = ("CREATE UNIQUE INDEX principals_live_key ON principals (key_thumbprint) "
                   "WHERE revoked_at IS NULL AND key_thumbprint IS NOT NULL")
_V6_COMMON: list[str | Step] = [
    "CREATE INDEX principals_name ON principals (name, created_at)",
    _LIVE_NAME_INDEX,
    "ALTER TABLE console_sessions ADD COLUMN principal_id TEXT",
    "UPDATE console_sessions SET principal_id = (SELECT p.id FROM principals p "
    "WHERE p.name = console_sessions.principal)",
    "CREATE INDEX console_sessions_principal_id ON console_sessions (principal_id)",
    "ALTER TABLE requests ADD COLUMN requester_jkt TEXT",
    # One key counts once per Checkpoint, as one approver name does: an approver who
    # rotated away from a key cannot have it approve again under a second name.
    "ALTER TABLE resolutions ADD COLUMN approver_jkt TEXT",
    "CREATE UNIQUE INDEX resolutions_key ON resolutions (checkpoint_cid, approver_jkt) "
    "WHERE approver_jkt IS NOT NULL",
    # Thumbprints of the keys already registered; where unrevoked principals share one,
    # the step revokes all but the oldest and says so in the logbook (a finding).
    Step("backfill_key_thumbprints"),
    _LIVE_KEY_INDEX,
]
_V6_SQLITE: list[str | Step] = [
    _PRINCIPALS_V6,
    "INSERT INTO principals_v6 (id, name, token_hash, roles, public_jwk, created_at, "
    "revoked_at) SELECT 'pr_' || lower(hex(randomblob(16))), name, token_hash, roles, "
    "public_jwk, created_at, revoked_at FROM principals",
    "DROP TABLE principals",
    "ALTER TABLE principals_v6 RENAME TO principals",
    *_V6_COMMON,
]
_V6_POSTGRES: list[str | Step] = [
    "ALTER TABLE principals ADD COLUMN id TEXT",
    "UPDATE principals SET id = 'pr_' || md5(random()::text || clock_timestamp()::text "
    "|| name)",
    # PostgreSQL's own name for version 1's primary key on the name.
    "ALTER TABLE principals DROP CONSTRAINT principals_pkey",
    "ALTER TABLE principals ADD PRIMARY KEY (id)",
    "ALTER TABLE principals ADD COLUMN key_thumbprint TEXT",
    *_V6_COMMON,
]

# Version 7: a request left ``preparing`` because its Pilot could not be reached is tried
# again by whichever ``harbour serve`` process claims it first (a compare-and-set on its
# version), so the bookkeeping lives in the row, not in a process: how many attempts at its
# preparation were started, and when the next may start. Existing rows get 0 and NULL (a
# request nobody recorded an attempt for), which the retry treats as due once untouched for
# a lease; no content is rewritten.
_V7 = [
    "ALTER TABLE requests ADD COLUMN prepare_attempts INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE requests ADD COLUMN prepare_due DOUBLE PRECISION",
    "CREATE INDEX requests_prepare_due ON requests (state, prepare_due)",
]

# Version 8: the public key each Pilot signs its execution reports with, kept with its
# registration (``null`` for a Pilot that never registered one). A nullable column, so
# every existing row stays as it was.
_V8 = ["ALTER TABLE pilots ADD COLUMN report_key TEXT"]

# Version 9: notifications (docs/notifications.md). The endpoints an admin configured; the
# outbox of events, each written in the transaction of the request move it reports; and one
# delivery per event and endpoint, retried until delivered, claimed for each attempt by a
# compare-and-set on its lease so that several processes never post it at once. New
# tables only: no existing row is touched.
_V9 = [
    """CREATE TABLE webhook_endpoints (
        id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        format TEXT NOT NULL,
        events TEXT NOT NULL,
        principal TEXT,
        secret TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        created_by TEXT NOT NULL,
        removed_at DOUBLE PRECISION)""",
    """CREATE TABLE outbox_events (
        id TEXT PRIMARY KEY,
        type TEXT NOT NULL,
        request TEXT,
        data TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX outbox_events_request ON outbox_events (request, created_at)",
    """CREATE TABLE webhook_deliveries (
        event_id TEXT NOT NULL REFERENCES outbox_events (id),
        endpoint_id TEXT NOT NULL REFERENCES webhook_endpoints (id),
        state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed', 'cancelled')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at DOUBLE PRECISION NOT NULL,
        lease_owner TEXT,
        lease_until DOUBLE PRECISION,
        last_status INTEGER,
        last_error TEXT,
        delivered_at DOUBLE PRECISION,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (event_id, endpoint_id))""",
    "CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_at)",
    "CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, state)",
]

# Version 10: signing in through an OpenID provider (docs/console.md). One row of settings
# (``harbour oidc set``); each sign-in's one-time ``state`` with its nonce and PKCE verifier
# (stored by the SHA-256 of the state, bound to the browser that started it); the SHA-256
# of each ID token the command line exchanged, so one is never exchanged twice; and, on a
# session, how it was opened (``via``: token, oidc or cli), the roles it was granted and
# where they came from, and the provider's subject and session id (for back-channel
# logout). Existing sessions get NULLs: token sessions, as they were.
_V10 = [
    """CREATE TABLE oidc_settings (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        body TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE oidc_logins (
        state_hash TEXT PRIMARY KEY,
        browser_hash TEXT NOT NULL,
        nonce TEXT NOT NULL,
        code_verifier TEXT NOT NULL,
        next_path TEXT NOT NULL,
        issuer TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        used_at DOUBLE PRECISION)""",
    "CREATE INDEX oidc_logins_expires ON oidc_logins (expires_at)",
    """CREATE TABLE oidc_exchanged (
        token_hash TEXT PRIMARY KEY,
        expires_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX oidc_exchanged_expires ON oidc_exchanged (expires_at)",
    "ALTER TABLE console_sessions ADD COLUMN via TEXT",
    "ALTER TABLE console_sessions ADD COLUMN roles TEXT",
    "ALTER TABLE console_sessions ADD COLUMN roles_from TEXT",
    "ALTER TABLE console_sessions ADD COLUMN oidc_subject TEXT",
    "ALTER TABLE console_sessions ADD COLUMN oidc_sid TEXT",
    "CREATE INDEX console_sessions_oidc_sid ON console_sessions (oidc_sid)",
]

# Version 11: a sign-in through the provider is checked again at the provider every
# ``oidc.recheck_seconds`` (docs/console.md). Per console session opened through it: when
# it was last checked, and the provider's refresh token the check uses (useless without
# the client secret, which is not in the store). Sessions opened before get a row saying
# they were checked when they began and hold no refresh token: their first check ends them.
_V11 = [
    """CREATE TABLE oidc_session_checks (
        session_hash TEXT PRIMARY KEY,
        refresh_token TEXT,
        checked_at DOUBLE PRECISION NOT NULL)""",
    "INSERT INTO oidc_session_checks (session_hash, refresh_token, checked_at) "
    "SELECT session_hash, NULL, created_at FROM console_sessions WHERE via = 'oidc'",
]

# Version 12: an exchanged ID token names the session it opened, so that a refresh at the
# provider answering that very token (it can, within the same second) is accepted as that
# session's renewal and nothing else (store/oidc_sql.py). Tokens exchanged before name no
# session: they can renew none, and are refused again as they were.
_V12 = [
    "ALTER TABLE oidc_exchanged ADD COLUMN session_hash TEXT",
]

#: Every column of ``requests`` this code reads and writes, in table order.
CURRENT_REQUEST_COLUMNS: tuple[str, ...] = (*REQUEST_COLUMNS_V3, "requester_jkt",
                                            "prepare_attempts", "prepare_due")

MIGRATIONS: dict[str, list[Sequence[str | Step]]] = {
    "sqlite": [_V1, _V2_SQLITE, _V3, _V4, _V5, _V6_SQLITE, _V7, _V8, _V9, _V10, _V11,
               _V12],
    "postgres": [_V1, _V2_POSTGRES, _V3, _V4, _V5, _V6_POSTGRES, _V7, _V8, _V9, _V10, _V11,
                 _V12],
}

#: The schema version this code writes and reads.
LATEST = 12
