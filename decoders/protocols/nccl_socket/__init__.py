"""NCCL's socket transport and its bootstrap, proxy and RAS connections."""
