"""Helpers of the fault suite (tests/test_faults.py)."""
