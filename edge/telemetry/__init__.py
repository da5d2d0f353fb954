"""Telemetry: one module per platform, each reading its sensors independently."""
