"""Fault-injection and invariant-checking harness for attachment pipelines."""
