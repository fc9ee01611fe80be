"""The one error the decoders raise internally; boundaries turn it into an event or a one-line message."""


class DecodeError(Exception):
    """Bytes that do not make sense as the format being decoded."""
