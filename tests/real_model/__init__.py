"""The real-model test tier (see conftest.py)."""
