"""Sans-IO decoders: capture records -> packets -> TCP streams -> protocol events."""
