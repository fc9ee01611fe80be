"""Gloo's pair transport: its decoder (`decoder`, over the framing of `wire`), its collectives rebuilt from the
messages (`collectives`) and sized by the algorithms' model (`model`, `sizes`)."""
