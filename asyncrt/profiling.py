"""Seeing what happens: traces, profile reports, timelines, benchmarks.

The tools behind :mod:`asyncrt.debug_executor`, :func:`asyncrt.time_evaluator`
and ``GraphModule.benchmark``, for use on their own:

* :class:`Trace`, :class:`~scheduler.trace.RunTrace` and
  :class:`~scheduler.trace.Span`: what ran, where and when;
* :class:`ProfileReport`: per-node device times, per op and per device,
  sortable, as text, JSON or CSV;
* :func:`chrome_trace` / :func:`save_chrome_trace`: a timeline for Perfetto
  or ``chrome://tracing``; :func:`save_gantt`: the same as a picture
  (needs ``asyncrt[plot]``); :func:`save_plan_picture`: a plan as a graph;
* :func:`time_evaluator` and :class:`BenchmarkResult`: TVM's measurement.
"""

from scheduler.trace import RunTrace as RunTrace
from scheduler.trace import Span as Span

from .tools._pictures import save_gantt as save_gantt
from .tools._pictures import save_plan_picture as save_plan_picture
from .tools._profile import SORT_KEYS as SORT_KEYS
from .tools._profile import GroupProfile as GroupProfile
from .tools._profile import NodeProfile as NodeProfile
from .tools._profile import ProfileReport as ProfileReport
from .tools._time_evaluator import BenchmarkResult as BenchmarkResult
from .tools._time_evaluator import TimeEvaluator as TimeEvaluator
from .tools._time_evaluator import time_evaluator as time_evaluator
from .tools._timeline import chrome_trace as chrome_trace
from .tools._timeline import save_chrome_trace as save_chrome_trace
from .tools._trace import Trace as Trace

__all__ = (
    "SORT_KEYS",
    "BenchmarkResult",
    "GroupProfile",
    "NodeProfile",
    "ProfileReport",
    "RunTrace",
    "Span",
    "TimeEvaluator",
    "Trace",
    "chrome_trace",
    "save_chrome_trace",
    "save_gantt",
    "save_plan_picture",
    "time_evaluator",
)
