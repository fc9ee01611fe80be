"""dlcsniff: what a distributed deep-learning job puts on the network, per tensor, without touching the job.

The command line is `dlcsniff` (dlcsniff.cli). For scripts and notebooks:

    import dlcsniff
    job = dlcsniff.decode(["pcaps/mxnet_sync"], out="out/mxnet_sync")   # or dlcsniff.load("out/mxnet_sync")
    job.table("messages")              # any table of the decode output as a DataFrame
    job.statistics().summary           # what `dlcsniff stats` computes
    job.write_report("mxnet_sync.html")

The names below are loaded on first use, so `import dlcsniff` (and the command line's start-up) stays light.
"""
from dlcsniff._version import __version__

__all__ = ["AnalysisError", "CaptureError", "Decoded", "DecodeError", "OutputError", "Stats", "decode", "load",
           "__version__"]


def __getattr__(name: str):
    if name in ("Decoded", "decode", "load"):
        from dlcsniff.analysis import decoded
        return getattr(decoded, name)
    if name in ("AnalysisError", "Stats"):
        from dlcsniff import analysis
        return getattr(analysis, name)
    if name in ("CaptureError", "DecodeError"):
        from dlcsniff.decoders import errors
        return getattr(errors, name)
    if name == "OutputError":
        from dlcsniff.decoders.output_dir import OutputError
        return OutputError
    raise AttributeError(f"module 'dlcsniff' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
