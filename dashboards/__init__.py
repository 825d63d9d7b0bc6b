"""Streamlit dashboards for operators: `gpufleet dashboard` (see dashboards/app.py)."""
