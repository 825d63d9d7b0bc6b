"""The dashboard pages, one script each, run by dashboards/app.py through st.navigation."""
