"""The whole pipeline as a user runs it (``streamrec demo``): every test here is marked ``e2e``."""
