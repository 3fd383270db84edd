"""Every record and message that crosses the wire or the seam: a typed struct with its encode, decode and bounds."""
