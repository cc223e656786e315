"""The chaos suite: the platform as processes under kill -9, and its invariants."""
