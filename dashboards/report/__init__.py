"""The weekly waste report for managers (issue #7): HTML, PDF, plain text and e-mail.

    model.py     gathers every figure from the analytics (no figure is computed here)
    charts.py    inline SVG charts
    render.py    HTML / text / subject from templates/ (Jinja2, autoescaped HTML)
    pdf.py       the same HTML printed to PDF by headless Chromium
    mail.py      SMTP delivery: HTML + text alternative + PDF attachment
    pipeline.py  configuration -> figures -> files and messages (the command and the schedule)
    config.py    the [report] section
    window.py    ISO weeks in the report's time zone

No Streamlit and no network at view time: a report is one HTML file.
"""
