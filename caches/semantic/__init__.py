"""Semantic stores: one contract (base.py), Qdrant Edge embedded and Qdrant server."""
