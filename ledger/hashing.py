from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Key-sorted, whitespace-free JSON: equal payloads hash equally whatever the key order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_hex(value: Any) -> str:
    data = value if isinstance(value, str | bytes) else canonical_json(value)
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()
