"""Training data for HPD-aligned fine-tuning and distillation.

Public surface, ``training.data``: ``resolve_sources`` (records, schema and gold of a ``--train``
path), ``load_gold`` and ``load_teacher`` (labelled products from gold, or from another
``hpd extract`` run), each a ``TrainingData``.

The trainer itself is ``hpd_core.finetune``; the command line (``hpd finetune``) is ``jobs.finetune``.
"""
