"""dlcsniff command-line interface."""
__version__ = "0.1.0"
