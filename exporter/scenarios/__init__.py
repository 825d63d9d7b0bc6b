"""Scenario files shipped with the exporter (read with importlib.resources)."""
