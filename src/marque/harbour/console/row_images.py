"""A statement preview's row images as the request page shows them (DESIGN §12).

One table per statement: key, column, before, after — every column of each
changed row, the changed cells highlighted, inserted and deleted rows marked —
and past the Pilot's cap the plain words "showing N of K rows". A statement
whose rows could not be imaged shows why. Nothing here is computed anew: it is
the stored preview (:mod:`marque.target.row_images`), laid out.
"""

from __future__ import annotations

from typing import Any

__all__ = ["row_images_view"]

#: How each kind of row is marked: (label, tone).
_OPS = {"update": ("updated", "info"), "insert": ("inserted", "ok"),
        "delete": ("deleted", "bad")}


def row_images_view(images: Any) -> dict[str, Any] | None:
    """The template's view of one statement's ``row_images`` (None: it writes no rows)."""
    if not isinstance(images, dict):
        return None
    if images.get("status") != "captured":
        return {"captured": False, "reason": images.get("reason")}
    rows = []
    for index, row in enumerate(images.get("rows") or [], start=1):
        op = str(row.get("op"))
        before = row.get("before") if isinstance(row.get("before"), dict) else None
        after = row.get("after") if isinstance(row.get("after"), dict) else None
        changed = set(row.get("changed") or [])
        columns = list((before or after or {}).keys())
        cells = [{"column": c, "before": (before or {}).get(c), "after": (after or {}).get(c),
                  "has_before": before is not None, "has_after": after is not None,
                  "changed": c in changed if op == "update" else True}
                 for c in columns]
        label, tone = _OPS.get(op, (op, "unknown"))
        rows.append({"index": index, "op": op, "label": label, "tone": tone,
                     "key": row.get("key"), "cells": cells})
    total = images.get("total")
    return {"captured": True, "table": images.get("table"), "key": images.get("key") or [],
            "key_declared": images.get("key_source") == "declared",
            "total": total, "shown": images.get("shown"),
            "truncated": bool(images.get("truncated")), "rows": rows,
            "before_cid": images.get("before_cid"),
            "caption": (f"showing {len(rows):,} of {total:,} rows (the rest are counted, not "
                        "shown)" if images.get("truncated") and isinstance(total, int)
                        else f"every changed row ({total})")}
