"""Security pieces every component shares (floor 1): token verification (tokens.py)."""
