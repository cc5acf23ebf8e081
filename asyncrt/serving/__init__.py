"""Serving many callers: a dynamic batcher in front of an executor.

:class:`Batcher` joins concurrent requests into batched runs (bounded
queue delay, preferred batch sizes, grouping by shape or declared
:class:`Padding`), and reports what it did (:class:`BatchStats`, a
:class:`BatchRecord` per recent batch, a Chrome trace). See
``docs/serving.md``.
"""

from ._batcher import Batcher as Batcher
from ._batcher import Clock as Clock
from ._batcher import LoopClock as LoopClock
from ._spec import Padding as Padding
from ._stats import BatchRecord as BatchRecord
from ._stats import BatchStats as BatchStats
from ._stats import Percentiles as Percentiles

__all__ = (
    "BatchRecord",
    "BatchStats",
    "Batcher",
    "Clock",
    "LoopClock",
    "Padding",
    "Percentiles",
)
