"""The ledger client library: pure cores (write, recovery) and their asyncio shell."""
