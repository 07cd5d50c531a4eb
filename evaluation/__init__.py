"""Scoring extraction output against gold: the ExtractGPT metric and its strict variant.

Public surface:

- ``evaluation.scoring``: ``evaluate(predictions, gold, attributes) -> EvaluationResult`` and
  ``evaluate_extractgpt_run`` (recompute a stored ExtractGPT run and check it against its results).
- ``evaluation.report``: ``write_reports`` (``_evaluation.json`` and ``_evaluation.md`` beside the
  predictions).
- ``evaluation.metrics``: the metric itself (``extractgpt_metric``, ``strict_metric``, outcome
  counts and scores), free of any file format.
- ``evaluation.convert``: benchmark files (ExtractGPT JSONL) -> records, attribute schema and gold.

The gold, schema and prediction readers are in ``datafiles``; the command lines (``hpd evaluate``,
``hpd convert``) in ``jobs``.
"""
