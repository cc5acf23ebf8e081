"""What the importer and the import rewrites both ask of names and nodes."""

from __future__ import annotations

import onnx

__all__ = ("DEFAULT_DOMAINS", "PRIVATE_DOMAIN", "is_op", "unique_name")

#: The domains of ONNX's own operators.
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})
#: The domain of the nodes asyncrt's own rewrites make (fused ops): only
#: ever in a rewritten copy of a model, never read from a model file.
PRIVATE_DOMAIN = "ai.asyncrt"


def unique_name(base: str, used: set[str]) -> str:
    """``base``, else ``base_1``, ``base_2``...: the first not in ``used``,
    which then holds it."""
    name, n = base, 0
    while name in used:
        n += 1
        name = f"{base}_{n}"
    used.add(name)
    return name


def is_op(node: onnx.NodeProto | None, op_type: str) -> bool:
    """Whether ``node`` is one of ONNX's own ``op_type`` nodes."""
    return (
        node is not None and node.op_type == op_type and node.domain in DEFAULT_DOMAINS
    )
