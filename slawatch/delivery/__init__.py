"""Stage 3, getting alerts out: the dispatcher (lease, send, settle, retry, dead
letters), storm summaries, and the notifiers. A notifier knows alerts (dicts),
never SQL or the engine."""
