"""Stage 5, the running process: the scheduler (scan jobs, delivery workers,
reload), scan records, maintenance (lease rescue, retention), and start-up
(boot: the database, the config, the admin server)."""
