"""Checking a conversion: the parity engine and the networks it runs."""
