"""Transactions' shared, pure parts: the transaction coordinator's state machine
(:mod:`.state`), the records of ``__transaction_state`` (:mod:`.log`) and their defaults
(:mod:`.defaults`). No I/O: the coordinator service drives them (docs/transactions.md)."""
