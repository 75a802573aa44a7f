"""Actions (docs/explanation/actions.md): a rule's statement, run when a deadline passes.

``run`` runs the actions a claim owes inside the claim's transaction and records
every attempt in ``slawatch.action``; ``webhook`` instead writes a webhook action's
delivery (sent by the delivery workers) and its pending attempt; ``history`` lists
them and replays failed ones.
"""
