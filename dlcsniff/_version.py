"""dlcsniff's version, the one place it is written: the distribution reads it at build time (pyproject.toml,
tool.setuptools.dynamic), the package root and the manifests import it (decoders.output_dir), with no
importlib.metadata look-up at run time."""
__version__ = "0.1.0"
