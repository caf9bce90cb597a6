"""``marque keys``: Ed25519 keys (JWK) for issuers and holders."""

from __future__ import annotations

from pathlib import Path

import click

from marque.cli.common import (
    emit_json,
    guarded,
    json_option,
    literal,
    out,
    read_json_file,
    write_private,
)
from marque.errors import InvalidInput


@click.group("keys", no_args_is_help=True)
def keys() -> None:
    """Ed25519 keys (JWK) for issuers and holders."""


@keys.command("new")
@click.option("--out", "out_file", type=click.Path(path_type=Path), required=True,
              help="Where to write the private JWK (mode 0600; never overwritten).")
@click.option("--public", is_flag=True, help="Print the public JWK on stdout.")
@json_option
@guarded
def keys_new(out_file: Path, public: bool, as_json: bool) -> None:
    """Create a new Ed25519 private JWK (issuer or holder); refuses to overwrite."""
    from marque.token import new_key, public_jwk

    key = new_key()
    try:
        write_private(out_file, key)
    except FileExistsError as exc:
        raise InvalidInput(f"{out_file} exists; refusing to overwrite a key") from exc
    except OSError as exc:
        raise InvalidInput(f"cannot write {out_file}: {exc.strerror}") from exc
    pub = public_jwk(key)
    if as_json:
        emit_json({"kid": key["kid"], "out": str(out_file), "public_jwk": pub})
    elif public:
        emit_json(pub)
    else:
        out.say(f"wrote private key {literal(key['kid'])} to {literal(out_file)}")


@keys.command("public")
@click.argument("key_file", type=click.Path(path_type=Path))
@json_option
@guarded
def keys_public(key_file: Path, as_json: bool) -> None:
    """Print the public JWK of a key file (private or public)."""
    from marque.token import public_jwk

    emit_json(public_jwk(read_json_file(key_file, "key")))
