"""Measurements that run the model (shared by the checker and the converters)."""
