"""Approval: what a tool call asks, how it is shown to a person, and the policies that decide."""
