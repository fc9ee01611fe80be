"""NCCL job-wide: the sends of every NCCL connection (RoCE and sockets: `wire`) and the collectives they make
(`collectives`)."""
