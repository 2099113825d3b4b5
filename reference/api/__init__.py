"""HTTP API of the reference (FastAPI)."""
