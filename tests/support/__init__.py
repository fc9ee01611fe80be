"""Helpers the tests and the benchmarks share: recorders of ground truth, generators of captures from
the protocol definitions, drivers of the real tools. No tests here."""
