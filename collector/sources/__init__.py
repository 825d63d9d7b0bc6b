"""Collector sources, one file each, behind the small interface in base.py."""
