"""Command-line tools: elvin-notify, elvin-subscribe."""
