"""PyTorch's TCPStore: the rendezvous its queries carry, whose ranks Gloo and NCCL read."""
