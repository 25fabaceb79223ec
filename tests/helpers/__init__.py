"""Helpers shared by several test files, imported as ``tests.helpers.<part>`` (fixtures live in conftest.py)."""
