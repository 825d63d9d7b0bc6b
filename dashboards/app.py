"""gpufleet dashboards: the router. `gpufleet dashboard` runs this with `streamlit run`.

Every page shares the frame set up here: sign-in (when configured), the common filters in the
sidebar (time window, cluster, account, user, GPU model, partition; bound to the URL's query
parameters, so a URL is shareable and the filters follow the user across pages), and the
auto-refresh. The pages (dashboards/views/*.py; not "pages/", which Streamlit would take for its legacy
multipage folder) are UI only: they call analytics through the
cached loaders of dashboards/data.py.

    streamlit run dashboards/app.py -- [--config gpufleet.toml] [--store DIR] [--served]

--served (which `gpufleet dashboard` passes) writes gpufleet's log lines to stderr.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from gpufleet.dashboards import config as dconfig
from gpufleet.dashboards import data, ui
from gpufleet.config import ConfigError

HERE = Path(__file__).resolve().parent
PAGES = (
    ("views/fleet_now.py", "Fleet now", "fleet-now", ":material/grid_view:"),
    ("views/utilization.py", "Utilization", "utilization", ":material/monitoring:"),
    ("views/jobs.py", "Jobs", "jobs", ":material/work:"),
    ("views/teams.py", "Teams and fairness", "teams", ":material/groups:"),
    ("views/waste.py", "Waste and cost", "waste", ":material/savings:"),
    ("views/health.py", "Health", "health", ":material/health_and_safety:"),
    ("views/mfu.py", "MFU", "mfu", ":material/speed:"),
    ("views/reliability.py", "Reliability", "reliability", ":material/build:"),
)

st.set_page_config(page_title="gpufleet", page_icon=":material/memory:", layout="wide")

try:
    settings = data.current_settings()
except ConfigError as e:
    st.title("gpufleet")
    st.error("The dashboard's configuration is not valid:")
    st.code(str(e), language=None)
    st.stop()

if dconfig.served():  # served by `gpufleet dashboard`: its log on stderr
    ui.log_to_stderr()

if not ui.sign_in_gate(settings):
    st.stop()

# The first page is served at "/": Streamlit's default page has no name in the URL, and the name it
# reserves for it does not open it. Its own name works too (/fleet-now), as every other page's does,
# through a second, unlisted entry (the default page's reserved name is then DEFAULT_URL).
DEFAULT_URL = "start"
pages = [st.Page(str(HERE / path), title=title, url_path=DEFAULT_URL if i == 0 else url, icon=icon, default=i == 0)
         for i, (path, title, url, icon) in enumerate(PAGES)]
path, title, url, icon = PAGES[0]
pages.append(st.Page(str(HERE / path), title=title, url_path=url, icon=icon, visibility="hidden"))
page = st.navigation(pages)
ctx = ui.sidebar()
page.run()
ui.auto_refresh(ctx)
