"""Router-to-router federation (Elvin federation protocol 1.0)."""
