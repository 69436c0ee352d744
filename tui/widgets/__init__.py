"""Widgets of the runwatch app."""
