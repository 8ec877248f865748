"""Coming from agent-ledger 0.2.x: its key, its table, the importer, the fallback.

Nothing is imported here on purpose: each module sits in its own layer
(``keys`` among the value modules, ``table`` beside the stores, ``fallback``
beside the ledger, ``importer`` beside the CLI; see ``pyproject.toml``).
See docs/migrating-from-0.2.md for what differs and how to switch.
"""
