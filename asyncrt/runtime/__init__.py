"""The executor core: what happens between ``await ex.run(x=...)`` and the
dispatcher.

* ``_context``: run contexts (one run's activations) and the fair, bounded
  pool that lends them to concurrent callers;
* ``_host_feed``: pre-bound host views of a context's inputs and outputs;
* ``_threads``: kernel thread pools, sized to the cpu streams;
* ``_process``, ``_process_wire``, ``_process_worker``, ``_blas_choice``:
  run contexts in worker processes (``processes=True``);
* ``_remote_worker``: kernels looked up by name on remote workers.

Nothing here is public API; :mod:`asyncrt.graph_executor` is the facade.
"""
