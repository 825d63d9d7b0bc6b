"""Data files: prices, GPU peak FLOPS."""
