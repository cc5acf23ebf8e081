"""Seeing what happens: traces, profile reports, timelines, pictures, the
time evaluator and ``GraphModule.benchmark``. The public names are
re-exported by :mod:`asyncrt.profiling` and :mod:`asyncrt`."""
