"""Stage 1, what the operator wrote: settings (environment and flags), rules,
notifier models, durations, and reading YAML files into them. Imports nothing of
slawatch but the foundations (errors)."""
