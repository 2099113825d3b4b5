"""Load and flow-control runs: upload load (locust) and the prefetch / local-queue bound probe (BE-JOB-004)."""
