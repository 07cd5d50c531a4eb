"""The throughput benchmark: the baseline and HPD side by side on one model, inputs and machine.

Public surface:

- ``bench.workload``: ``records_workload`` (real records) and ``synthetic_workload``
  (``SyntheticSpec``: fixed value lengths), both a ``Workload`` of engine requests.
- ``bench.model``: ``load`` (the model(s) and tokenizer of a run; ``RANDOM_ARCHS`` for random
  weights of a published architecture).
- ``bench.decoders``: ``make_decoders`` and ``decode``.
- ``bench.single``: ``run_single`` (one comparison, ``bench.json`` + ``bench.md``);
  ``bench.sweep``: ``run_sweep`` (J x batch grid, ``sweep.json``/``.md``/``.png``).

Inside: ``compare`` (timed, alternating repeats), ``measure`` (passes, memory, timing),
``report`` (machine and run header), ``plot`` (Markdown tables and the sweep figure). The command
line (``hpd bench``) is ``jobs.bench``.
"""
