"""The collector: scrapes exporters or reads Prometheus, pulls scheduler accounting, writes the store."""
