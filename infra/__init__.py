"""Adapters to the outside world (storage, sandboxes, inference, telemetry, the embedded stack)."""
