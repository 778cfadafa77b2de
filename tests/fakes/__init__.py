"""Loopback fakes of external services (real wire formats, real client libraries)."""
