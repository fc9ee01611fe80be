"""ps-lite (MXNet, BytePS) over ZMTP: its decoder (`decoder`, with the meta's descriptor `meta`), its job-wide step
(node ids and roles: `job`; tensors: `tensors`) and which capture shows which node (`vantage`)."""
