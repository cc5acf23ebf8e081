"""What a batcher accepts: its configuration checked against the executor,
and each request checked against the model before it joins a batch.

A request is checked alone, on the event loop, in microseconds: the input
names, each value's dtype and rank, its rows (the extent on the batch
axis, the same for every input), and its other dimensions against the
model: for a graph with symbolic shapes through
:meth:`~asyncrt.graph.SymbolicGraph.signature` (fixed dimensions, symbols
bound consistently, the model's own limits), for a static graph against its
fixed shapes. What passes gets a group key: requests share a batch only
when their keys are equal, that is when every dimension but the batch axis
(and the padded length, where the batcher pads) is the same.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from devices import NDArray, numpy_dtype

from ..errors import ArgumentError, InputError
from ..graph import SymbolicGraph
from ..graph_executor import GraphModule

__all__ = (
    "DEFAULT_MAX_BATCH",
    "Config",
    "InputSpec",
    "Padding",
    "Prepared",
    "configure",
)

#: ``max_batch`` for a graph with a symbolic batch dimension, if not given.
DEFAULT_MAX_BATCH = 32

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Padding:
    """How requests of different lengths share a batch.

    Each input in ``axes`` is padded along its length axis with its value in
    ``values`` up to the batch's length (the next of ``buckets``, or the
    longest request's length without buckets); each output in ``trim`` is
    cut back to the request's own length along the axis given. The model
    must be one where padding changes nothing the caller keeps (a
    transformer whose attention mask is padded with 0, for instance).

    :ivar axes: the length axis of each padded input, by name.
    :ivar values: the pad value of each padded input, by name.
    :ivar trim: the length axis of each output cut back, by output index.
    :ivar buckets: the lengths a batch is padded up to, ascending (a few
        of them keep the number of shape signatures, and so of plans,
        small); a request longer than the last is batched at its own
        length. Empty: a batch is padded to its longest request.
    :raises ArgumentError: if a value is of the wrong type, an input has
        an axis but no value (or the reverse), or the buckets are not
        positive and ascending.
    """

    axes: Mapping[str, int]
    values: Mapping[str, float | int | bool]
    trim: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    buckets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.axes, Mapping) or not self.axes:
            raise ArgumentError(
                f"Padding.axes must map input names to axes, got {self.axes!r}"
            )
        if not isinstance(self.values, Mapping) or set(self.values) != set(self.axes):
            raise ArgumentError(
                "Padding.values must give a pad value for exactly the inputs in "
                f"Padding.axes ({', '.join(sorted(self.axes))}), got {self.values!r}"
            )
        for name, axis in self.axes.items():
            _integer(f"Padding.axes[{name!r}]", axis)
        for name, value in self.values.items():
            if not isinstance(value, (int, float, bool, np.generic)):
                raise ArgumentError(
                    f"Padding.values[{name!r}] must be a number, got {value!r}"
                )
        if not isinstance(self.trim, Mapping):
            raise ArgumentError(
                f"Padding.trim must map output indices to axes, got {self.trim!r}"
            )
        for index, axis in self.trim.items():
            _integer("an output index in Padding.trim", index, minimum=0)
            _integer(f"Padding.trim[{index}]", axis)
        buckets = tuple(self.buckets)
        for bucket in buckets:
            _integer("a bucket in Padding.buckets", bucket, minimum=1)
        if list(buckets) != sorted(set(buckets)):
            raise ArgumentError(
                f"Padding.buckets must be ascending without repeats, got {buckets!r}"
            )
        object.__setattr__(self, "axes", MappingProxyType(dict(self.axes)))
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "trim", MappingProxyType(dict(self.trim)))
        object.__setattr__(self, "buckets", buckets)

    def bucket(self, length: int) -> int:
        """The length a request of ``length`` is padded to in a batch (its
        own length past the last bucket; without buckets, ``-1``: the
        batch decides)."""
        if not self.buckets:
            return -1
        for bucket in self.buckets:
            if bucket >= length:
                return bucket
        return length


@dataclass(frozen=True)
class InputSpec:
    """One batched input.

    :ivar name: its name.
    :ivar dtype: its numpy dtype.
    :ivar shape: the model's shape (ints fixed, strings symbolic).
    :ivar axis: its batch axis (non-negative).
    :ivar length_axis: its padded axis, or ``None``.
    :ivar pad_value: what pads it.
    """

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | str, ...]
    axis: int
    length_axis: int | None = None
    pad_value: Any = 0


@dataclass(frozen=True)
class Config:
    """A batcher's configuration, checked against its executor."""

    inputs: tuple[InputSpec, ...]
    output_axes: tuple[int, ...]
    trim: Mapping[int, int]
    padding: Padding | None
    max_batch: int
    sizes: tuple[int, ...]
    max_batch_bytes: int | None
    symbolic: SymbolicGraph | None

    def batch_size(self, rows: int) -> int:
        """The rows a batch of ``rows`` real rows runs with: the next
        preferred size (``rows`` itself without preferred sizes)."""
        for size in self.sizes:
            if size >= rows:
                return size
        return rows


@dataclass
class Prepared:
    """A request that passed its checks.

    :ivar arrays: its inputs, by name.
    :ivar rows: its rows.
    :ivar length: its length (0 without padding).
    :ivar key: its group.
    :ivar fixed_bytes: bytes per row of its inputs that are not padded.
    :ivar length_bytes: bytes per row and unit of length of its padded
        inputs.
    """

    arrays: dict[str, Array]
    rows: int
    length: int
    key: Hashable
    fixed_bytes: int
    length_bytes: int

    def row_bytes(self, length: int) -> int:
        """Bytes per row of its inputs padded to ``length``."""
        return self.fixed_bytes + self.length_bytes * length


def configure(
    ex: GraphModule,
    batch_axes: Mapping[str, int],
    output_axes: Sequence[int] | None,
    max_batch: int | None,
    preferred_batch_sizes: Sequence[int] | None,
    padding: Padding | None,
    max_batch_bytes: int | None,
) -> Config:
    """The batcher's configuration, checked against ``ex``.

    :raises ArgumentError: for anything the executor cannot batch so.
    """
    if not isinstance(ex, GraphModule):
        raise ArgumentError(
            f"a Batcher needs an executor (graph_executor.create), got "
            f"{type(ex).__name__}"
        )
    if max_batch_bytes is not None:
        _integer("max_batch_bytes", max_batch_bytes, minimum=1)
    if padding is not None and not isinstance(padding, Padding):
        raise ArgumentError(f"padding must be a Padding, got {type(padding).__name__}")
    if not isinstance(batch_axes, Mapping) or not batch_axes:
        raise ArgumentError(
            "batch_axes must map every input a request gives to its batch axis, "
            f"got {batch_axes!r}"
        )
    graph = ex.graph
    symbolic = graph if isinstance(graph, SymbolicGraph) else None
    shapes, dtypes = ex.get_input_info()
    specs = []
    static_rows: set[int] = set()
    for name, axis in batch_axes.items():
        spec = _input_spec(ex, symbolic, name, axis, shapes, dtypes, padding)
        specs.append(spec)
        batch_dim = spec.shape[spec.axis]
        if isinstance(batch_dim, int):
            if symbolic is not None:
                raise ArgumentError(
                    f"input {name!r}: the model fixes axis {spec.axis} at "
                    f"{batch_dim}, so it cannot be a batch axis"
                )
            static_rows.add(batch_dim)
    if symbolic is not None:
        inputs = set(symbolic.inputs)
    else:  # a static graph's inputs but its parameters (loaded so far)
        parameters = ex.core.parameters
        inputs = {n for n in ex.core.input_names() if n not in parameters}
    missing = sorted(inputs - set(batch_axes))
    if missing:
        raise ArgumentError(
            f"batch_axes must give a batch axis for every input; missing: "
            f"{', '.join(missing)}"
        )
    if static_rows:
        if len(static_rows) > 1:
            raise ArgumentError(
                "the graph's inputs have different sizes on their batch axes: "
                f"{sorted(static_rows)}"
            )
        (rows,) = static_rows
        if padding is not None:
            raise ArgumentError(
                "padding needs a graph with symbolic shapes (a static graph's "
                "lengths are fixed)"
            )
        max_batch = rows if max_batch is None else max_batch
        _integer("max_batch", max_batch, minimum=1)
        if max_batch > rows:
            raise ArgumentError(
                f"max_batch is {max_batch}, but the graph's batch size is {rows}: "
                "a static graph runs batches of exactly its size"
            )
        if preferred_batch_sizes is not None and tuple(preferred_batch_sizes) != (
            rows,
        ):
            raise ArgumentError(
                f"a static graph runs batches of exactly {rows} rows: "
                f"preferred_batch_sizes must be ({rows},) or None"
            )
        sizes: tuple[int, ...] = (rows,)
    else:
        max_batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
        _integer("max_batch", max_batch, minimum=1)
        sizes = _sizes(preferred_batch_sizes, max_batch)
    outputs = ex.get_num_outputs()
    axes = tuple(0 for _ in range(outputs)) if output_axes is None else output_axes
    if isinstance(axes, (str, bytes)) or len(axes) != outputs:
        raise ArgumentError(
            f"output_axes must give one batch axis per output ({outputs}), "
            f"got {output_axes!r}"
        )
    for index, axis in enumerate(axes):
        _integer(f"output_axes[{index}]", axis)
    trim = {} if padding is None else dict(padding.trim)
    for index in trim:
        if index >= outputs:
            raise ArgumentError(
                f"Padding.trim names output {index}, but the graph has {outputs}"
            )
    return Config(
        inputs=tuple(specs),
        output_axes=tuple(axes),
        trim=MappingProxyType(trim),
        padding=padding,
        max_batch=max_batch,
        sizes=sizes,
        max_batch_bytes=max_batch_bytes,
        symbolic=symbolic,
    )


def _input_spec(
    ex: GraphModule,
    symbolic: SymbolicGraph | None,
    name: object,
    axis: object,
    shapes: Mapping[str, tuple[int | str, ...]],
    dtypes: Mapping[str, str],
    padding: Padding | None,
) -> InputSpec:
    if not isinstance(name, str) or ex.get_input_index(name) < 0:
        known = ", ".join(symbolic.inputs if symbolic else sorted(shapes)) or "none"
        raise ArgumentError(f"batch_axes names no input {name!r}; inputs: {known}")
    if symbolic is None and name in ex.core.parameters:
        raise ArgumentError(f"{name!r} is a parameter, not an input to batch")
    if symbolic is not None:
        declared = symbolic.inputs.get(name)
        if declared is None:
            raise ArgumentError(f"{name!r} is a parameter, not an input to batch")
        if declared.shape_valued:
            raise ArgumentError(
                f"input {name!r} decides shapes by its values, so requests cannot "
                "be joined along an axis of it"
            )
    shape = tuple(shapes[name])
    rank = len(shape)
    norm = _axis(f"batch_axes[{name!r}]", axis, rank)
    length_axis: int | None = None
    pad_value: Any = 0
    if padding is not None and name in padding.axes:
        length_axis = _axis(f"Padding.axes[{name!r}]", padding.axes[name], rank)
        if length_axis == norm:
            raise ArgumentError(
                f"input {name!r}: the padded axis must not be the batch axis ({norm})"
            )
        if isinstance(shape[length_axis], int):
            raise ArgumentError(
                f"input {name!r}: the model fixes axis {length_axis} at "
                f"{shape[length_axis]}, so it cannot be padded"
            )
        pad_value = padding.values[name]
    if padding is not None:
        for padded in padding.axes:
            if padded not in (symbolic.inputs if symbolic else shapes):
                raise ArgumentError(f"Padding.axes names no input {padded!r}")
    dtype = np.dtype(numpy_dtype(dtypes[name]))
    return InputSpec(name, dtype, shape, norm, length_axis, pad_value)


def _sizes(preferred: Sequence[int] | None, max_batch: int) -> tuple[int, ...]:
    """The preferred batch sizes: given, or powers of two up to
    ``max_batch`` (and ``max_batch`` itself)."""
    if preferred is None:
        sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
        return (*sizes, max_batch)
    if isinstance(preferred, (str, bytes)):
        raise ArgumentError(
            f"preferred_batch_sizes must be a sequence of sizes, got {preferred!r}"
        )
    sizes = list(preferred)
    for size in sizes:
        _integer("a preferred batch size", size, minimum=1)
    if sizes != sorted(set(sizes)):
        raise ArgumentError(
            f"preferred_batch_sizes must be ascending without repeats, got {sizes}"
        )
    if sizes and sizes[-1] > max_batch:
        raise ArgumentError(
            f"preferred batch size {sizes[-1]} is over max_batch ({max_batch})"
        )
    if sizes and sizes[-1] < max_batch:
        raise ArgumentError(
            f"the largest preferred batch size ({sizes[-1]}) must be max_batch "
            f"({max_batch}), so that every batch has a preferred size"
        )
    return tuple(sizes)


def prepare(config: Config, inputs: Mapping[str, Any]) -> Prepared:
    """Check one request; see the module docstring.

    :raises InputError: naming the input and what is wrong with it.
    """
    specs = config.inputs
    padding = config.padding
    if len(inputs) != len(specs) or any(s.name not in inputs for s in specs):
        expected = {s.name for s in specs}
        missing = sorted(expected - set(inputs))
        unknown = sorted(set(inputs) - expected)
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if unknown:
            parts.append(f"unknown {', '.join(unknown)}")
        raise InputError(
            f"a request gives exactly the inputs {', '.join(sorted(expected))}: "
            + "; ".join(parts)
        )
    arrays: dict[str, Array] = {}
    rows = length = -1
    key: list[Hashable] = []
    fixed_bytes = length_bytes = 0
    for spec in specs:
        array = _array(spec, inputs[spec.name])
        if array.ndim != len(spec.shape):
            raise InputError(
                f"input {spec.name!r} has {array.ndim} dimensions; the model's "
                f"shape is {spec.shape}"
            )
        own = array.shape[spec.axis]
        if rows < 0:
            rows = own
        elif own != rows:
            raise InputError(
                f"input {spec.name!r} has {own} rows on its batch axis "
                f"{spec.axis}, the request's other inputs {rows}"
            )
        shape: list[int] = list(array.shape)
        shape[spec.axis] = -1
        row = array.nbytes // own if own else 0
        if spec.length_axis is not None and padding is not None:
            extent = array.shape[spec.length_axis]
            if length < 0:
                length = extent
            elif extent != length:
                raise InputError(
                    f"input {spec.name!r} has length {extent} on axis "
                    f"{spec.length_axis}, the request's other padded inputs {length}"
                )
            shape[spec.length_axis] = padding.bucket(extent)
            length_bytes += row // extent if extent else 0
        else:
            fixed_bytes += row
            if config.symbolic is None:
                _check_static(spec, array)
        key.append(tuple(shape))
        arrays[spec.name] = array
    if not 1 <= rows <= config.max_batch:
        raise InputError(
            f"a request has {rows} rows; the batcher takes 1 to {config.max_batch}"
        )
    if config.symbolic is not None:
        config.symbolic.signature(
            {name: tuple(a.shape) for name, a in arrays.items()},
            {},
            dtypes={s.name: _dtype_name(s.dtype) for s in specs},
        )
    prepared = Prepared(
        arrays, rows, max(length, 0), tuple(key), fixed_bytes, length_bytes
    )
    budget = config.max_batch_bytes
    if budget is not None:
        padded = prepared.length
        if padding is not None and padding.bucket(padded) > padded:
            padded = padding.bucket(padded)
        alone = config.batch_size(rows) * prepared.row_bytes(padded)
        if alone > budget:
            raise InputError(
                f"a request of {rows} rows needs {alone} bytes of batch inputs "
                f"(padded to {config.batch_size(rows)} rows), over max_batch_bytes "
                f"({budget})"
            )
    return prepared


def _array(spec: InputSpec, value: Any) -> Array:
    if isinstance(value, NDArray):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        if value.dtype != spec.dtype:
            raise InputError(
                f"input {spec.name!r} expects dtype {_dtype_name(spec.dtype)}, "
                f"got {_dtype_name(value.dtype)}"
            )
        return value
    try:
        return np.asarray(value, dtype=spec.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(
            f"input {spec.name!r}: cannot use {value!r:.80}: {exc}"
        ) from exc


def _check_static(spec: InputSpec, array: Array) -> None:
    for axis, (dim, got) in enumerate(zip(spec.shape, array.shape, strict=True)):
        if axis != spec.axis and isinstance(dim, int) and dim != got:
            raise InputError(
                f"input {spec.name!r} expects {dim} on axis {axis} (shape "
                f"{spec.shape} but the batch axis), got {got}"
            )


def _dtype_name(dtype: np.dtype[Any]) -> str:
    name = str(dtype)
    return "bool" if name == "bool_" else name


def _axis(what: str, axis: object, rank: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise ArgumentError(
            f"{what} must be an axis of a {rank}-dimensional input, got {axis!r}"
        )
    return axis % rank


def _integer(what: str, value: object, *, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{what} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ArgumentError(f"{what} must be >= {minimum}, got {value}")


def finite_delay(max_delay_ms: object) -> float:
    """``max_delay_ms`` in seconds.

    :raises ArgumentError: unless it is a finite number >= 0.
    """
    if (
        isinstance(max_delay_ms, bool)
        or not isinstance(max_delay_ms, (int, float))
        or not math.isfinite(max_delay_ms)
        or max_delay_ms < 0
    ):
        raise ArgumentError(
            f"max_delay_ms must be a finite number >= 0, got {max_delay_ms!r}"
        )
    return float(max_delay_ms) / 1e3
