"""Stage 2, the database side of watching: the schema and each rule's DDL
(migrate, catalog), the batch claim of both ways to track (claim, statetable),
counting what is due (due), first-deployment baselines, and the outbox's rows and
alert payloads (outbox). Knows SQL, never HTTP."""
