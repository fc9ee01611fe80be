"""Capture side of dlcsniff: the only package that needs root, live interfaces, namespaces or eBPF."""
