"""Offline PySpark analysis of federation trace files."""
