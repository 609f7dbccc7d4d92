"""Release packaging: the tables as a reproducible data wheel and sdist with an in-toto statement (cut.py)."""
