"""The files the evaluation, benchmark and training packages read, in one place.

Public surface:

- ``datafiles.storage``: ``resolve`` (URI -> pyarrow file system and path), ``read_text``,
  ``read_json_lines``, ``read_jsonl`` for local paths, ``file://`` and ``s3://`` URIs.
- ``datafiles.dataset``: the files of ``hpd convert`` (``RECORDS_FILE``, ``ATTRIBUTES_FILE``,
  ``GOLD_FILE``) and their readers ``read_records``, ``read_attributes`` (any attribute schema
  format the extraction job reads), ``read_gold`` (``GoldExample`` rows, ``target_scores`` checked
  by ``validate_target_scores``).
- ``datafiles.predictions``: the output of ``hpd extract`` (``URI/attributes/`` Parquet):
  ``read_predictions`` (with ``only=``, the values of some products of an output of any size), and
  ``attribute_files`` / ``read_columns`` for its files one by one;
  ``attribute_paths``, ``rows_by_category`` and ``read_values`` for an output of any size.

Depends on pipelines (the schema formats) only; no torch, no Ray.
"""
