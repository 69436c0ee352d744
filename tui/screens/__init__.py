"""Screens of the runwatch app, one per file."""
