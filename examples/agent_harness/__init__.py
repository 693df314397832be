"""A resumable agent harness (checkpoints at points A and B, an effects ledger, a
three-way reconcile on resume), with tool-dispatcher as its effects ledger.

Run it with ``python -m examples.agent_harness [--resume]``; see README.md.
"""
