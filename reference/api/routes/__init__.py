"""The API's routes, one router per resource (reference/api/app.py includes them, in this order):
attachments (upload, status, events), admin (operator replay and reprocessing of one attachment), dlq (the
dead-letter queue), health (/healthz, /metrics)."""

from __future__ import annotations

from fastapi import APIRouter

from reference.api.routes import admin, attachments, dlq, health

ROUTERS: tuple[APIRouter, ...] = (attachments.router, admin.router, dlq.router, health.router)
