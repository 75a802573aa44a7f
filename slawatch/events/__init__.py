"""Events (docs/explanation/events.md): deadlines opened and closed by messages instead of rows.

``ingest`` checks a batch and writes it; ``sources`` reads brokers into it. The
timers themselves are engine state (engine/timers.py), claimed like any rule.
"""
