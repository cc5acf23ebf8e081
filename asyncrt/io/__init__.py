"""Getting graphs and parameters in and out: TVM's params format
(``_params``, ``_param_dict``), the exported-module artifact (``_artifact``:
one zip, no code) and ``build`` / ``export_library`` / ``load_module``
(``_factory``)."""
