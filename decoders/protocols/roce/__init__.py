"""RoCE (v1 and v2): queue pairs, their RDMA operations, NCCL's IB set-up connections."""
