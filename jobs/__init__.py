"""The `hpd` command line: thin entry points over the packages that do the work.

- ``jobs.cli``: ``main`` (the ``hpd`` console script), one subcommand per module below.
- ``jobs.extract`` + ``jobs.config``: the extraction job (``pipelines``) and its configuration.
- ``jobs.evaluate``, ``jobs.convert``: over ``evaluation`` (and ``datafiles``).
- ``jobs.bench``: over ``bench``.
- ``jobs.finetune``: over ``training`` and ``hpd_core.finetune``.

Nothing outside ``jobs`` imports it.
"""


class CommandFailed(Exception):
    """A command that started and failed (not a usage error): ``hpd`` prints the message, exits 1."""
