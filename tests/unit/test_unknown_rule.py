"""An unknown rule's name, wherever it is given (a silence's rule, an alert's name),
gets one line that names the rules there are: the first 20 of them."""

from __future__ import annotations

from slawatch.operate.lifecycle import unknown_rule


def test_the_rules_there_are_are_named_up_to_20() -> None:
    names = [f"r{i:02}" for i in range(25)]
    error = unknown_rule("rule", "nope", reversed(names))
    assert str(error) == (
        "rule: no rule named 'nope' (defined: " + ", ".join(names[:20]) + ", ...)"
    )
    assert str(unknown_rule("alert", "x", ["b", "a"])) == (
        "alert: no rule named 'x' (defined: a, b)"
    )
    assert str(unknown_rule("rule", "x", [])) == "rule: no rule named 'x' (defined: none)"
