"""Retention: old terminal calls leave the database for a verified archive.

A pass (:func:`dispatcher.retention.run.run_pass`, `tool-dispatcher retention --once`)
archives each tenant's due calls (:mod:`~dispatcher.retention.eligibility`) in batches,
each written as Parquet files (:mod:`~dispatcher.retention.archive`), read back and
verified, and only then removed (:mod:`~dispatcher.retention.batches`); a day of the
event log is dropped whole once none of its events belongs to a live call or run
(:mod:`~dispatcher.retention.partitions`). Every write goes through
:mod:`dispatcher.ledger.retention`; a crash at any step is resumed from the manifest.
:mod:`~dispatcher.retention.show` folds an archived run into the API's run view.
"""
