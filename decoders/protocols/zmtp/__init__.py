"""ZMTP, the transport ps-lite stands on: its framing (`decoder`) and its streams caught mid-connection
(`midstream`)."""
