"""Stage 4, what people use to look and act: the admin API and on-call page,
inspection (status, alerts), explain, acks and silences (lifecycle), metrics."""
