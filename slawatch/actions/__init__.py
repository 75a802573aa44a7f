"""Actions (DESIGN.md §8): a rule's statement, run when a deadline passes.

``run`` runs the actions a claim owes inside the claim's transaction and records
every attempt in ``slawatch.action``; ``history`` lists them and replays failed ones.
"""
