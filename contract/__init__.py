"""The AIOS Model Contract: its spec as data, one check per requirement, tiering, reports."""
