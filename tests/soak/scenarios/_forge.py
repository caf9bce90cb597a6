"""Forged tokens, hand-assembled: the attack vectors of matrix row 13 and a byte-mutation fuzz.

Every forgery is built the way an attacker would build it — JWS segments
assembled by hand, signed with real keys through ``cryptography`` (Ed25519 and
HMAC), or a real token cut and re-glued — never by mocking a verifier. Some
are signed by the *trusted* issuer key itself (duplicate JSON members, a
payload that is not a JSON object, a change that does not hash to its CID):
those prove the claims are checked after the signature holds, not merely that
an unknown signature is refused.

:func:`vectors` returns the named vectors for one kind of token (``marque``,
``preview`` or ``query``); :func:`mutate` makes one byte-level mutation of a
token from a :class:`random.Random`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from marque.cid import cid
from marque.logbook.heads import sign_head
from marque.token import MARQUE_TYP, POP_TYP
from marque.token.service_tokens import PREVIEW_TYP, QUERY_TYP

TYP = {"marque": MARQUE_TYP, "preview": PREVIEW_TYP, "query": QUERY_TYP}
B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
#: Ed25519's group order: a signature's S plus L is the classic malleability probe.
ED25519_L = 2**252 + 27742317777372353535851937790883648493


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def seg(value: Any) -> str:
    """A JWS segment: ``value`` as compact JSON, or a str/bytes taken as the raw JSON text."""
    if isinstance(value, bytes):
        return b64(value)
    if isinstance(value, str):
        return b64(value.encode("utf-8"))
    return b64(json.dumps(value, separators=(",", ":")).encode("utf-8"))


def ed25519_sign(jwk: dict[str, Any], signing_input: str) -> str:
    """Sign ``header.payload`` with a private Ed25519 JWK, by ``cryptography`` directly."""
    key = Ed25519PrivateKey.from_private_bytes(unb64(jwk["d"]))
    return b64(key.sign(signing_input.encode("ascii")))


def assemble(header: Any, payload: Any, key: dict[str, Any] | None) -> str:
    """A compact JWS of ``header`` and ``payload`` signed by ``key`` (EdDSA), or unsigned ("")."""
    signing_input = f"{seg(header)}.{seg(payload)}"
    signature = "" if key is None else ed25519_sign(key, signing_input)
    return f"{signing_input}.{signature}"


def hs256(header: Any, payload: Any, secret: bytes) -> str:
    """A compact JWS signed with HMAC-SHA256 under ``secret`` (the alg-confusion attack)."""
    signing_input = f"{seg(header)}.{seg(payload)}"
    mac = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def parts(token: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(header, claims, signature segment) of a real token (read without verifying)."""
    h, p, s = token.split(".")
    return json.loads(unb64(h)), json.loads(unb64(p)), s


@dataclass(frozen=True)
class Vector:
    """One forged token: what it is, which verifier it is handed to, and the refusal expected."""

    name: str
    kind: str
    token: str
    #: The code the verifier must refuse with.
    code: str = "marque_invalid"


def _self_signed_cert_der(attacker: dict[str, Any]) -> str:
    """A self-signed X.509 certificate for the attacker's key (for an ``x5c`` header)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    key = Ed25519PrivateKey.from_private_bytes(unb64(attacker["d"]))
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "marque-issuer")])
    now = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=36500)).sign(key, None))
    return base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")


def vectors(kind: str, valid: str, *, issuer: dict[str, Any], attacker: dict[str, Any],
            others: dict[str, str]) -> list[Vector]:
    """The named forgeries of one ``kind`` of token, derived from a ``valid`` one.

    ``issuer`` is the trusted issuer's private key (what a real issuer would
    sign with), ``attacker`` a key nobody trusts, ``others`` valid tokens of
    the other kinds (for type confusion).
    """
    header, claims, signature = parts(valid)
    typ = TYP[kind]
    kid = header["kid"]
    attacker_pub = {k: attacker[k] for k in ("kty", "crv", "x")}
    attacker_kid = attacker["kid"]
    issuer_pub_x = unb64(issuer["x"])
    out: list[Vector] = []

    def add(name: str, token: str, code: str = "marque_invalid") -> None:
        out.append(Vector(f"{kind}: {name}", kind, token, code))

    # -- alg: none, and friends -----------------------------------------------------------
    for alg in ("none", "None", "NONE", "nOnE"):
        add(f"alg {alg}, empty signature", assemble({**header, "alg": alg}, claims, None))
    add("alg none, signature kept", f"{seg({**header, 'alg': 'none'})}.{seg(claims)}.{signature}")
    add("alg none, no kid", assemble({"alg": "none", "typ": typ}, claims, None))
    add("alg missing", assemble({"typ": typ, "kid": kid}, claims, issuer))
    for alg in ("Ed25519", "eddsa", "EdDSA ", "ES256", "RS256", "PS256", "ES256K", "EdDSA\u0000"):
        add(f"alg {alg!r} signed by the issuer", assemble({**header, "alg": alg}, claims, issuer))
    add("alg as a list", assemble({**header, "alg": ["EdDSA"]}, claims, issuer))

    # -- HS256 keyed with public material (RFC 8725 §2.1 algorithm confusion) --------------
    secrets = {
        "the raw public key bytes": issuer_pub_x,
        "the public x as text": issuer["x"].encode(),
        "the public JWK JSON": json.dumps({k: issuer[k] for k in ("kty", "crv", "x")}).encode(),
        "the kid": kid.encode(),
        "an empty key": b"",
    }
    for what, secret in secrets.items():
        add(f"HS256 keyed with {what}", hs256({**header, "alg": "HS256"}, claims, secret))
    add("HS512 keyed with the raw public key", _hs512({**header, "alg": "HS512"}, claims,
                                                        issuer_pub_x))

    # -- hostile kids ---------------------------------------------------------------------
    hostile_kids: list[Any] = [
        "../../../../etc/passwd", "/dev/zero", "..%2f..%2fpilot.json", "file:///etc/shadow",
        "http://127.0.0.1:9/jwks.json", "https://attacker.invalid/k", "' OR '1'='1",
        "k\u0000" + kid, kid + "\n", kid.upper(), "\u202e" + kid, "A" * 20_000, "", 7, None,
        ["k"], {"kid": kid}, True, 1.5,
    ]
    for hostile in hostile_kids:
        shown = repr(hostile) if not isinstance(hostile, str) or len(hostile) < 40 \
            else f"{len(hostile)} characters"
        add(f"hostile kid {shown}, signed by the attacker",
            assemble({**header, "kid": hostile}, claims, attacker))
    add("kid absent, signed by the issuer", assemble(
        {k: v for k, v in header.items() if k != "kid"}, claims, issuer))

    # -- keys offered by the token itself ---------------------------------------------------
    add("jku to an attacker JWKS, attacker kid", assemble(
        {**header, "kid": attacker_kid, "jku": "http://127.0.0.1:9/jwks.json"}, claims, attacker))
    add("jku to an attacker JWKS, trusted kid", assemble(
        {**header, "jku": "http://127.0.0.1:9/jwks.json"}, claims, attacker))
    add("x5u to an attacker certificate", assemble(
        {**header, "kid": attacker_kid, "x5u": "http://127.0.0.1:9/cert.pem"}, claims, attacker))
    add("x5c with an attacker certificate, trusted kid", assemble(
        {**header, "x5c": [_self_signed_cert_der(attacker)]}, claims, attacker))
    add("x5c with an attacker certificate, no kid", assemble(
        {"alg": "EdDSA", "typ": typ, "x5c": [_self_signed_cert_der(attacker)]}, claims, attacker))
    add("embedded jwk, no kid", assemble(
        {"alg": "EdDSA", "typ": typ, "jwk": attacker_pub}, claims, attacker))
    add("embedded jwk, trusted kid", assemble(
        {**header, "jwk": attacker_pub}, claims, attacker))
    add("embedded jwk, attacker kid", assemble(
        {**header, "kid": attacker_kid, "jwk": {**attacker_pub, "kid": attacker_kid}}, claims,
        attacker))
    add("trusted kid, signed by the attacker", assemble(header, claims, attacker))
    add("crit header, signed by the issuer", assemble(
        {**header, "crit": ["exp"], "exp": 1}, claims, issuer))
    add("b64 false, signed by the issuer", assemble(
        {**header, "b64": False, "crit": ["b64"]}, claims, issuer))

    # -- typ ----------------------------------------------------------------------------
    for wrong in ("JWT", "jwt", "", None, typ.upper(), typ + " ", POP_TYP,
                  "marque-logbook-head+jwt", *(t for k, t in TYP.items() if k != kind)):
        if wrong is None:
            forged_header = {k: v for k, v in header.items() if k != "typ"}
        else:
            forged_header = {**header, "typ": wrong}
        add(f"typ {wrong!r}, signed by the issuer", assemble(forged_header, claims, issuer))
    add("typ as a list, signed by the issuer", assemble({**header, "typ": [typ]}, claims, issuer))
    for other_kind, token in others.items():
        add(f"a valid {other_kind} presented as a {kind}", token)
    add("a signed logbook head presented as a " + kind, sign_head(
        {"seq": 1, "hash": "0" * 64, "at": 1.0}, issuer))

    # -- duplicate members, signed by the trusted issuer ---------------------------------------
    hdr_text = json.dumps(header, separators=(",", ":"))
    pay_text = json.dumps(claims, separators=(",", ":"))
    add("duplicate kid in the header (attacker's first)", _signed_raw(
        '{"kid":' + json.dumps(attacker_kid) + "," + hdr_text[1:], pay_text, issuer))
    add("duplicate alg in the header (none last)", _signed_raw(
        hdr_text[:-1] + ',"alg":"none"}', pay_text, issuer))
    add("duplicate typ in the header", _signed_raw(hdr_text[:-1] + ',"typ":"JWT"}', pay_text,
                                                   issuer))
    for member in ("exp", "jti", "pilot", "iss"):
        if member in claims:
            extra = {"exp": 4_102_444_800, "jti": "mq_someone_else",
                     "pilot": {"id": "p2", "incarnation": "x"}, "iss": "attacker"}[member]
            add(f"duplicate {member} in the payload", _signed_raw(
                hdr_text, pay_text[:-1] + f',"{member}":' + json.dumps(extra) + "}", issuer))
    add("duplicate member deep in the payload", _signed_raw(
        hdr_text, pay_text.replace('"pilot":{', '"pilot":{"id":"p9",', 1), issuer))

    # -- payloads that are not what they claim, signed by the trusted issuer -------------------
    for name, raw in (
        ("an array", b"[]"), ("a string", b'"claims"'), ("null", b"null"),
        ("NaN inside", pay_text[:-1].encode() + b',"x":NaN}'),
        ("Infinity inside", pay_text[:-1].encode() + b',"x":-Infinity}'),
        ("a lone surrogate", pay_text[:-1].encode() + b',"x":"\\ud800"}'),
        ("not UTF-8", pay_text.encode()[:-1] + b',"x":"\xff\xfe"}'),
        ("a UTF-8 BOM first", b"\xef\xbb\xbf" + pay_text.encode()),
        ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
        ("empty", b""),
        ("trailing data after the object", pay_text.encode() + b"{}"),
    ):
        add(f"payload {name}, signed by the issuer", _signed_raw(hdr_text, raw, issuer))
    add("header nested 10,000 deep, signed by the issuer", _signed_raw(
        "[" * 10_000 + "]" * 10_000, pay_text, issuer))
    add("header not JSON", _signed_raw("alg=EdDSA", pay_text, issuer))
    for name, value in (("1e400", 1e400), ("true", True), ("a string", "4102444800"),
                        ("2**64", 2**64), ("a float", 4102444800.5)):
        edited = {**claims, "exp": value}
        token = (_signed_raw(hdr_text, pay_text.replace(f'"exp":{claims["exp"]}', '"exp":1e400'),
                             issuer) if name == "1e400" else assemble(header, edited, issuer))
        add(f"exp {name}, signed by the issuer", token)
    for member in sorted(claims):
        add(f"claim {member} removed, signed by the issuer", assemble(
            header, {k: v for k, v in claims.items() if k != member}, issuer))
    if kind in ("marque", "preview"):
        change = claims["change"]
        sneaky = {**change, "statements": [{"sql": "DELETE FROM accounts", "params": []}]}
        add("change edited, old change_cid kept, signed by the issuer", assemble(
            header, {**claims, "change": sneaky}, issuer))
        recomputed = {k: v for k, v in sneaky.items() if k != "change_cid"}
        add("change edited with its CID recomputed, but not the signature", _resigned(
            header, {**claims, "change": {**recomputed, "change_cid": cid(recomputed)}},
            signature))
    if kind in ("preview", "query"):
        add("lives longer than five minutes, signed by the issuer", assemble(
            header, {**claims, "exp": claims["iat"] + 301}, issuer))

    # -- edits under the old signature ------------------------------------------------------
    edits: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "exp pushed out a year": lambda c: {**c, "exp": c["exp"] + 31_536_000},
        "iss changed": lambda c: {**c, "iss": "attacker"},
        "jti changed": lambda c: {**c, "jti": c["jti"] + "x"},
    }
    if kind == "marque":
        edits.update({
            "budget raised": lambda c: {**c, "budget": {**c["budget"], "executions": 10**9}},
            "max_rows raised": lambda c: {**c, "budget": {**c["budget"], "max_rows": 10**9}},
            "holder key swapped (cnf.jkt)": lambda c: {**c, "cnf": {"jkt": attacker_kid}},
            "target changed": lambda c: {**c, "target": "other"},
        })
    if kind == "query":
        edits["marque_id changed"] = lambda c: {**c, "marque_id": "mq_other"}
    if kind == "preview":
        edits["sample_rows raised"] = lambda c: {**c, "sample_rows": 1000}
    for name, edit in edits.items():
        add(f"{name} under the old signature", _resigned(header, edit(claims), signature))
    add("header re-serialised (spaces) under the old signature",
        _resigned({**header, "alg": "EdDSA", "typ": typ, "kid": kid}, claims, signature,
                  spaced=True))

    # -- the compact serialisation itself ---------------------------------------------------
    h, p, s = valid.split(".")
    sig = unb64(s)
    s_plus_l = (int.from_bytes(sig[32:], "little") + ED25519_L).to_bytes(32, "little")
    add("signature malleated (S + L)", f"{h}.{p}.{b64(sig[:32] + s_plus_l)}")
    add("signature truncated by one byte", f"{h}.{p}.{b64(sig[:-1])}")
    add("signature zeroed", f"{h}.{p}.{b64(bytes(64))}")
    add("signature empty", f"{h}.{p}.")
    add("signature segment missing", f"{h}.{p}")
    add("signature of another token", f"{h}.{p}.{others_signature(others)}")
    last = s[-1]
    flipped = B64_ALPHABET[B64_ALPHABET.index(last) ^ 1]
    add("signature in non-canonical base64url (unused bits set)", f"{h}.{p}.{s[:-1]}{flipped}")
    add("signature with base64 padding", f"{h}.{p}.{s}==")
    add("signature in standard base64 (+ and /)", f"{h}.{p}.{_std(s)}")
    add("header with base64 padding", f"{h}==.{p}.{s}")
    add("payload with base64 padding", f"{h}.{p}==.{s}")
    add("payload in standard base64", f"{h}.{_std(p)}.{s}")
    add("trailing garbage after the signature", f"{valid}AAAA")
    add("one trailing character", f"{valid}A")
    add("a fourth segment", f"{valid}.AAAA")
    add("trailing dot", f"{valid}.")
    add("a NUL at the end", f"{valid}\x00")
    add("whitespace inside", f"{h}.{p} .{s}")
    add("a newline inside", f"{h}.\n{p}.{s}")
    add("segments swapped", f"{p}.{h}.{s}")
    add("five segments (a JWE shape)", f"{h}.{p}.{s}.{s}.{s}")
    add("JWS JSON serialisation", json.dumps(
        {"payload": p, "signatures": [{"protected": h, "signature": s}]}))
    add("flattened JWS JSON", json.dumps({"payload": p, "protected": h, "signature": s}))
    add("2 MB of payload", f"{h}.{'A' * 2_000_000}.{s}")
    add("empty string", "")
    add("only dots", "..")
    add("non-ASCII in the signature", f"{h}.{p}.{s[:-1]}\u00e9")
    return out


def others_signature(others: dict[str, str]) -> str:
    return next(iter(others.values())).split(".")[2]


def _hs512(header: Any, payload: Any, secret: bytes) -> str:
    signing_input = f"{seg(header)}.{seg(payload)}"
    mac = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha512).digest()
    return f"{signing_input}.{b64(mac)}"


def _signed_raw(header_text: str | bytes, payload_text: str | bytes,
                key: dict[str, Any]) -> str:
    """Raw header and payload bytes (not re-serialised, so duplicates survive), signed."""
    signing_input = f"{seg(header_text)}.{seg(payload_text)}"
    return f"{signing_input}.{ed25519_sign(key, signing_input)}"


def _resigned(header: Any, claims: Any, signature: str, *, spaced: bool = False) -> str:
    """Header and claims re-encoded with an *old* signature glued on (an edit under it)."""
    header_text = json.dumps(header, separators=(", ", ": ") if spaced else (",", ":"))
    return f"{seg(header_text)}.{seg(claims)}.{signature}"


def _std(segment: str) -> str:
    """A segment in standard base64 (``+``/``/`` instead of ``-``/``_``), padded."""
    return base64.b64encode(unb64(segment)).decode("ascii")


# -- the fuzz ---------------------------------------------------------------------------------


def mutate(token: str, rng: random.Random) -> tuple[str, str]:
    """One random mutation of ``token``: (mutated token, what was done)."""
    choice = rng.randrange(9)
    n = len(token)
    i = rng.randrange(n)
    if choice == 0:
        bit = 1 << rng.randrange(7)
        return token[:i] + chr(ord(token[i]) ^ bit) + token[i + 1:], f"flip bit {bit} at {i}"
    if choice == 1:
        c = rng.choice(B64_ALPHABET)
        return token[:i] + c + token[i + 1:], f"replace {i} with {c!r}"
    if choice == 2:
        return token[:i] + token[i + 1:], f"delete {i}"
    if choice == 3:
        c = rng.choice(B64_ALPHABET + ".=+/ \x00\n\u00e9")
        return token[:i] + c + token[i:], f"insert {c!r} at {i}"
    if choice == 4:
        return token[:i], f"truncate at {i}"
    if choice == 5:
        j = rng.randrange(n)
        a, b = sorted((i, j))
        return token[:a] + token[b:b + 1] + token[a + 1:b] + token[a:a + 1] + token[b + 1:], \
            f"swap {a} and {b}"
    if choice == 6:
        j = min(n, i + rng.randrange(1, 16))
        return token[:i] + token[i:j] * 2 + token[j:], f"repeat {i}..{j}"
    # Decode a segment, change one byte of it, re-encode: valid base64url, altered content.
    segments = token.split(".")
    k = rng.randrange(len(segments))
    raw = bytearray(unb64(segments[k]))
    if not raw:
        return token + "A", "append A"
    at = rng.randrange(len(raw))
    if choice == 7:
        raw[at] ^= 1 << rng.randrange(8)
        what = f"flip a bit of byte {at} of segment {k}"
    else:
        raw[at] = rng.randrange(256)
        what = f"set byte {at} of segment {k}"
    segments[k] = b64(bytes(raw))
    return ".".join(segments), what
