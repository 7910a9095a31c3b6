"""The results database (SQLite): every run's record, its figures, sweeps."""
