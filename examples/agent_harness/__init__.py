"""The seed lesson's resumable agent harness, with tool-dispatcher as its effects ledger.

Run it with ``python -m examples.agent_harness [--resume]``; see README.md.
"""
