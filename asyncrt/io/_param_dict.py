"""TVM's ``save_param_dict`` / ``load_param_dict``, over NDArrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from devices import NDArray, array

from ._params import decode_params, encode_params

__all__ = ("load_param_dict", "save_param_dict")


def save_param_dict(params: Mapping[str, NDArray | np.ndarray[Any, Any]]) -> bytes:
    """Serialise named arrays in TVM's params format (byte-compatible).

    :param params: NDArrays (on any device) or numpy arrays, by name.
    :return: the blob.
    """
    return encode_params(
        {
            name: value.numpy() if isinstance(value, NDArray) else np.asarray(value)
            for name, value in params.items()
        }
    )


def load_param_dict(blob: bytes | bytearray | memoryview) -> dict[str, NDArray]:
    """Read a params blob written by TVM or :func:`save_param_dict`.

    :return: NDArrays on the cpu, by name.
    :raises ParamsError: if the blob is truncated or corrupt (with the byte
        offset).
    """
    return {name: array(value) for name, value in decode_params(blob).items()}
