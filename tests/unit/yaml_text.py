"""``GOOD + "key: other\\n"`` in a test means GOOD with that field changed; YAML files
may not give a key twice (config/files.py refuses it), so the tests' texts go through
:func:`last_wins` first."""

from __future__ import annotations


def last_wins(text: str) -> str:
    """``text`` with each top-level key's block (its line and the indented lines under
    it) kept only where the key is given last, in that place."""
    blocks: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if blocks and (line[:1] in (" ", "\t", "\n", "") or line.startswith("-")):
            blocks[-1].append(line)
        else:
            blocks.append([line])

    def key(block: list[str]) -> str:
        head = block[0]
        return head.split(":", 1)[0] if ":" in head and not head.startswith("?") else head

    last = {key(b): i for i, b in enumerate(blocks)}
    return "".join("".join(b) for i, b in enumerate(blocks) if last[key(b)] == i)
